# The layering the folders promise, as build errors rather than conventions:
#   summa_server_core links no gRPC (the parameter server is usable, and testable, without it);
#   summa_client links no BLAS (anything that only pushes tensors, the Python extension among
#   them, carries no linear algebra).
# Two checks each. At configure time, the target's whole link closure (its libraries and theirs)
# must not name the forbidden one. At build time, the whole archive is linked into a shared
# library with --no-undefined against only that closure: a source file that calls gRPC (or
# BLAS) without the target declaring it is an undefined symbol, a link error.

# Every library `target` links, directly or through others (targets and plain names).
function(summa_link_closure target out)
  set(seen)
  set(queue ${target})
  while(queue)
    list(POP_FRONT queue t)
    if(NOT TARGET ${t})
      continue()
    endif()
    get_target_property(alias ${t} ALIASED_TARGET)
    if(alias)
      set(t ${alias})
    endif()
    get_target_property(type ${t} TYPE)
    set(props INTERFACE_LINK_LIBRARIES)
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      list(APPEND props LINK_LIBRARIES)
    endif()
    foreach(prop ${props})
      get_target_property(libs ${t} ${prop})
      if(NOT libs)
        continue()
      endif()
      foreach(lib ${libs})
        # $<LINK_ONLY:x> and the like: the name inside.
        string(REGEX REPLACE "^\\$<[A-Z_]+:(.*)>$" "\\1" lib "${lib}")
        if(lib AND NOT lib IN_LIST seen)
          list(APPEND seen ${lib})
          list(APPEND queue ${lib})
        endif()
      endforeach()
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

add_custom_target(summa_layering_checks ALL)

# summa_forbid_link(<target> <why> <forbidden library>...)
function(summa_forbid_link target why)
  summa_link_closure(${target} closure)
  foreach(forbidden ${ARGN})
    foreach(lib ${closure})
      if(lib STREQUAL forbidden OR lib MATCHES "^${forbidden}$")
        message(FATAL_ERROR "layering: ${target} links ${lib} (${why})")
      endif()
    endforeach()
  endforeach()
  set(check ${target}_layering_check)
  file(WRITE ${CMAKE_BINARY_DIR}/layering/${check}.cc "// ${target} linked whole with --no-undefined.\n")
  add_library(${check} SHARED EXCLUDE_FROM_ALL ${CMAKE_BINARY_DIR}/layering/${check}.cc)
  target_link_libraries(${check} PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,${target}>")
  target_link_options(${check} PRIVATE "LINKER:--no-undefined")
  add_dependencies(summa_layering_checks ${check})
endfunction()

summa_forbid_link(summa_server_core "the server core is RPC-free: gRPC belongs in server/rpc"
  "gRPC::grpc\\+\\+" "gRPC::grpc\\+\\+_reflection" "gRPC::grpc" "summa_grpc_proto" "summa_rpc")
summa_forbid_link(summa_common "common/ is below gRPC: gRPC glue belongs in common/rpc"
  "gRPC::grpc\\+\\+" "gRPC::grpc\\+\\+_reflection" "gRPC::grpc" "summa_grpc_proto" "summa_rpc")
summa_forbid_link(summa_checkpoint "checkpoint files are below gRPC and below the core"
  "gRPC::grpc\\+\\+" "gRPC::grpc" "summa_grpc_proto" "summa_rpc" "summa_server_core")
summa_forbid_link(summa_client "the client carries no linear algebra: BLAS belongs in worker/compute"
  "PkgConfig::OPENBLAS" "summa_compute" "summa_models")
