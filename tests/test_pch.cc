// The source of summa_test_pch (tests/CMakeLists.txt), the target whose precompiled header
// every test reuses: the headers themselves are its precompile list, nothing is defined here.
