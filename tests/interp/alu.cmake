# tests/interp/alu.cmake: the ALU/SSE host-differential unit tests, the interp-vs-host instruction differential tester and the interp fuzzer.
get_filename_component(DEJA_ALU_ROOT "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)

# The unit tests compile the datapath sources themselves so that they run even while deja_interp is being built up.
set(DEJA_ALU_SOURCES ${DEJA_ALU_ROOT}/interp/alu.cpp)
set(DEJA_ALU_TEST_SOURCES ${CMAKE_CURRENT_LIST_DIR}/alu_test.cpp)
if(EXISTS ${DEJA_ALU_ROOT}/interp/sse.cpp)
  list(APPEND DEJA_ALU_SOURCES ${DEJA_ALU_ROOT}/interp/sse.cpp)
  list(APPEND DEJA_ALU_TEST_SOURCES ${CMAKE_CURRENT_LIST_DIR}/sse_test.cpp)
endif()
add_library(deja_alu_testlib STATIC ${DEJA_ALU_SOURCES})
target_include_directories(deja_alu_testlib PUBLIC ${DEJA_ALU_ROOT})

add_executable(alu_tests ${DEJA_ALU_TEST_SOURCES})
target_link_libraries(alu_tests PRIVATE deja_alu_testlib GTest::gtest_main)
gtest_discover_tests(alu_tests)
