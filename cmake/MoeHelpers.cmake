# Warnings as errors on our code only (system headers come in through SYSTEM include dirs).
set(MOE_WARNINGS -Wall -Wextra -Werror)

set(MOE_SANITIZE_FLAGS "")
if(MOE_SANITIZE)
  string(REPLACE "," ";" _moe_sans "${MOE_SANITIZE}")
  foreach(_s IN LISTS _moe_sans)
    if(NOT _s MATCHES "^(address|undefined)$")
      message(FATAL_ERROR "MOE_SANITIZE: unknown sanitizer '${_s}' (address, undefined)")
    endif()
  endforeach()
  set(MOE_SANITIZE_FLAGS -fsanitize=${MOE_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  # g++ 12 with -fsanitize reports false maybe-uninitialized warnings inside libstdc++'s
  # std::function (through std::regex and Catch2); the normal build keeps the warning as an error.
  # (clang has no such warning and would reject the flag.)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    list(APPEND MOE_WARNINGS -Wno-maybe-uninitialized)
  endif()
endif()
# Fuzzing builds instrument all our code for libFuzzer's coverage feedback; only the fuzz targets
# link libFuzzer itself (-fsanitize=fuzzer, tests/fuzz/CMakeLists.txt).
if(MOE_FUZZ)
  list(APPEND MOE_SANITIZE_FLAGS -fsanitize=fuzzer-no-link)
endif()

# nvcc gets the same host warnings (as errors) through -Xcompiler, and its own warnings as errors.
string(REPLACE ";" "," _moe_host_warnings "${MOE_WARNINGS}")
function(moe_target_defaults target)
  set(_cxx_flags ${MOE_WARNINGS} ${MOE_SANITIZE_FLAGS})
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:${_cxx_flags}>"
    "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_moe_host_warnings};--Werror=all-warnings>")
  target_link_options(${target} PRIVATE ${MOE_SANITIZE_FLAGS})
endfunction()

# moe_add_tool(moe-train SOURCES main.cpp ...)
function(moe_add_tool name)
  cmake_parse_arguments(T "" "" "SOURCES" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE moe_tools_common moe)
  moe_target_defaults(${name})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
  install(TARGETS ${name} RUNTIME DESTINATION bin)
endfunction()

# moe_add_test(test_name SOURCES a.cpp b.cpp) -> one Catch2 executable, each TEST_CASE a ctest entry
function(moe_add_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE moe_test_main moe)
  moe_target_defaults(${name})
  # -w NoTests: a ctest entry whose name does not reach its TEST_CASE (ctest cuts a name at ';')
  # fails instead of passing with nothing run.
  catch_discover_tests(${name}
    EXTRA_ARGS -w NoTests
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
    PROPERTIES LABELS "${T_LABELS}" SKIP_REGULAR_EXPRESSION "\\[cuda\\] skipped:")
endfunction()
