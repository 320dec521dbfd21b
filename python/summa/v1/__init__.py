# The summa.v1 wire contract: summa_pb2 and summa_pb2_grpc are generated from
# proto/summa/v1/summa.proto at build time (CMake target summa_python, or setup.py), never checked in.
