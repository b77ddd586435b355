cmake_minimum_required(VERSION 3.20)

# The test-name check: CTest takes each discovered Catch test's name as a CMake string, so a name
# holding ';' (a CMake list separator) becomes two tests that match nothing, and the case never
# runs under ctest. Run as
#   cmake -DSRC=<source root> -P cmake/CheckTestNames.cmake
# (the `test_names` test does). Scans the TEST_CASE lines of tests/ and fails naming each file and
# the line.

if(NOT SRC)
  message(FATAL_ERROR "CheckTestNames.cmake: pass -DSRC=<source root>")
endif()

file(GLOB_RECURSE sources "${SRC}/tests/*.cpp")
set(bad 0)
foreach(source IN LISTS sources)
  file(STRINGS "${source}" hits REGEX "TEST_CASE\\(\"[^\"]*;")
  if(hits)
    file(RELATIVE_PATH name "${SRC}" "${source}")
    message(SEND_ERROR "${name}: a TEST_CASE name holds ';', which CTest splits: ${hits}")
    math(EXPR bad "${bad} + 1")
  endif()
endforeach()
if(bad GREATER 0)
  message(FATAL_ERROR "test names holding ';' in ${bad} file(s): use ',' instead")
endif()
