cmake_minimum_required(VERSION 3.20)

# The layer check: no file includes a header of a higher layer. Run as
#   cmake -DSRC=<source root> -P cmake/CheckLayers.cmake
# (the `layers` test does). Scans the #include lines of libmoe/src, libmoe/include and tools/ and
# fails naming file:line for every include that points up. Layers, lowest first:
set(MOE_LAYERS kernels core backend ops optim comm balance parallel nn models io offload profile plan
               infer train tools)
# libmoe/include/moe/<layer>/ and libmoe/src/<layer>/ are one layer; top-level moe/*.h headers and
# src/core/ are core; backend/cpu and backend/cuda are backend; tools/ is the top.
# There are no exceptions: an upward include is fixed by moving the declaration down.

if(NOT SRC)
  message(FATAL_ERROR "CheckLayers.cmake: pass -DSRC=<source root>")
endif()

# The layer index of an included header ("moe/<layer>/x.h", "moe/x.h", "<layer>/x.h" from
# libmoe/src), or -1 for headers outside the layers (a tool's own, generated, third-party).
function(layer_of_include header out)
  set(layer "")
  if(header MATCHES "^moe/([a-z_]+)/")
    set(layer ${CMAKE_MATCH_1})
  elseif(header MATCHES "^moe/[^/]+$")
    set(layer core)
  elseif(header MATCHES "^([a-z_]+)/")
    set(layer ${CMAKE_MATCH_1})
  endif()
  list(FIND MOE_LAYERS "${layer}" index)
  set(${out} ${index} PARENT_SCOPE)
endfunction()

# The layer index of a scanned file (a path relative to the source root), or -1: the layer its
# path would have as an include ("libmoe/src/nn/x.cpp" as "nn/x.cpp", "libmoe/include/moe/x.h" as
# "moe/x.h"); tools/ is the top.
function(layer_of_file path out)
  if(path MATCHES "^tools/")
    list(FIND MOE_LAYERS tools index)
    set(${out} ${index} PARENT_SCOPE)
    return()
  endif()
  string(REGEX REPLACE "^libmoe/(include|src)/" "" as_include "${path}")
  layer_of_include("${as_include}" index)
  set(${out} ${index} PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE files RELATIVE ${SRC}
  ${SRC}/libmoe/src/*.h ${SRC}/libmoe/src/*.cpp ${SRC}/libmoe/src/*.cu ${SRC}/libmoe/src/*.cuh
  ${SRC}/libmoe/include/*.h ${SRC}/tools/*.h ${SRC}/tools/*.cpp)
list(SORT files)

set(violations "")
foreach(file IN LISTS files)
  layer_of_file("${file}" file_layer)
  if(file_layer LESS 0)
    continue()
  endif()
  file(STRINGS ${SRC}/${file} lines)
  set(line_number 0)
  foreach(line IN LISTS lines)
    math(EXPR line_number "${line_number} + 1")
    if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\"")
      continue()
    endif()
    set(header ${CMAKE_MATCH_1})
    layer_of_include("${header}" header_layer)
    if(header_layer LESS_EQUAL file_layer)
      continue()
    endif()
    list(GET MOE_LAYERS ${file_layer} from)
    list(GET MOE_LAYERS ${header_layer} to)
    string(APPEND violations "  ${file}:${line_number}: ${from} includes ${to} (${header})\n")
  endforeach()
endforeach()

if(violations)
  string(REPLACE ";" " < " order "${MOE_LAYERS}")
  message(FATAL_ERROR "upward includes (layers: ${order}):\n${violations}")
endif()
list(LENGTH files count)
message(STATUS "layers: ${count} files, no upward include")
