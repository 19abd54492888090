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

# Host-vs-interp differential tester and fuzzer: need the whole software CPU.
if(TARGET deja_interp AND EXISTS ${DEJA_ALU_ROOT}/interp/interp_backend.h)
  add_library(deja_difftest STATIC ${CMAKE_CURRENT_LIST_DIR}/diff/machine.cpp ${CMAKE_CURRENT_LIST_DIR}/diff/generator.cpp
                                   ${CMAKE_CURRENT_LIST_DIR}/diff/avx_generator.cpp
                                   ${CMAKE_CURRENT_LIST_DIR}/diff/xsave_generator.cpp)
  target_link_libraries(deja_difftest PUBLIC deja_interp Zydis::Zydis fmt::fmt)
  add_executable(interp_diff ${CMAKE_CURRENT_LIST_DIR}/diff/diff_main.cpp)
  target_link_libraries(interp_diff PRIVATE deja_difftest CLI11::CLI11)
  add_executable(interp_fuzz ${CMAKE_CURRENT_LIST_DIR}/diff/fuzz_main.cpp)
  target_link_libraries(interp_fuzz PRIVATE deja_difftest CLI11::CLI11)
  # Fixed seeds keep CI reproducible; run the binaries without --seed to explore new ones.
  # --avoid-xadd-same-register: a known interp defect (see docs/interp-alu.md); drop the flag once it is fixed.
  # --avoid-unmasked-underflow: the SSE approximation documented in docs/interp-alu.md (20,000 sequences meet it).
  # Under the sanitizers (10x slower) a tenth of the sequences: the normal build runs them all, and CI time is bounded.
  if(DEJA_SANITIZE)
    set(diff_sequences 2000)
    set(fastdiff_counts --sequences 500 --fuzz 500)
  else()
    set(diff_sequences 20000)
    set(fastdiff_counts --sequences 3000 --fuzz 3000)
  endif()
  add_test(NAME interp_diff COMMAND interp_diff --seed 1 --count ${diff_sequences} --cpu deja-v1
                                   --avoid-xadd-same-register --avoid-unmasked-underflow)
  # Every SIMD and x86-64-v2 instruction class on its own (the default model: the richest the software CPU
  # implements), each as many sequences as the original mix (about 4 s a class).
  foreach(class mmx mmx-sse sse3 ssse3 sse4.1 sse4.2 x86-64-v2)
    add_test(NAME interp_diff_${class} COMMAND interp_diff --seed 1 --count ${diff_sequences} --classes ${class}
                                                --avoid-unmasked-underflow)
    set_tests_properties(interp_diff_${class} PROPERTIES TIMEOUT 300)
  endforeach()
  # The VEX instructions (x86-64-v3 model): --count sequences of each class (AVX integer and floating point, FMA,
  # F16C, BMI1, BMI2, gathers); skipped (passing) on a host without AVX2.
  add_test(NAME interp_diff_avx COMMAND interp_diff --avx --seed 1 --count ${diff_sequences} --avoid-xadd-same-register
                                       --avoid-unmasked-underflow)
  set_tests_properties(interp_diff_avx PROPERTIES TIMEOUT 900)
  # XINUSE: VZEROUPPER/VZEROALL, XRSTOR with partial XSTATE_BV, state writes and reads, XGETBV(1), XSAVE and XSAVEOPT
  # (deja tracks XINUSE as Intel's processors do: on another host's the test is skipped, passing).
  add_test(NAME interp_diff_xsave COMMAND interp_diff --xsave --seed 1 --count ${diff_sequences})
  set_tests_properties(interp_diff_xsave PROPERTIES TIMEOUT 300)
  add_test(NAME interp_fuzz COMMAND interp_fuzz --seed 1 --count 200000 --seconds 20)
  set_tests_properties(interp_fuzz PROPERTIES TIMEOUT 120)
  set_tests_properties(interp_diff PROPERTIES TIMEOUT 900)
  # The fast path (threaded blocks and the JIT) against the reference executor, compared at every block
  # boundary: random sequences (half of their instructions from the SIMD classes), random code and the guest
  # images.
  add_executable(interp_fastdiff ${CMAKE_CURRENT_LIST_DIR}/diff/fastdiff_main.cpp)
  target_link_libraries(interp_fastdiff PRIVATE deja_difftest deja_boot deja_vmm CLI11::CLI11)
  set(fastdiff_guests)
  set(fastdiff_avx_guests)
  if(DEFINED DEJA_GUEST_DIR AND TARGET guests)
    foreach(guest hello exceptions paging cpu-bound memory)
      list(APPEND fastdiff_guests --guest ${DEJA_GUEST_DIR}/${guest}.elf)
    endforeach()
    # glibc's AVX2 string-function loops (the JIT's VEX templates), 5 M instructions.
    set(fastdiff_avx_guests --guest ${DEJA_GUEST_DIR}/string-bound.elf --cmdline n=2000 --max-steps 30000000)
    add_dependencies(interp_fastdiff guests)
  endif()
  foreach(mode threaded jit)
    add_test(NAME interp_fastdiff_${mode}
             COMMAND interp_fastdiff --mode ${mode} --seed 1 ${fastdiff_counts} ${fastdiff_guests}
                     --cmdline n=100000 --max-steps 30000000)
    set_tests_properties(interp_fastdiff_${mode} PROPERTIES TIMEOUT 600)
    # The same with the x86-64-v3 model: VEX sequences and VEX bytes in the random code, and the string-bound guest.
    add_test(NAME interp_fastdiff_${mode}_avx
             COMMAND interp_fastdiff --mode ${mode} --avx --seed 1 ${fastdiff_counts} ${fastdiff_avx_guests})
    set_tests_properties(interp_fastdiff_${mode}_avx PROPERTIES TIMEOUT 600)
  endforeach()
endif()
