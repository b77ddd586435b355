cmake_minimum_required(VERSION 3.20)

# The layer check: no file includes a header of a higher layer. Run as
#   cmake -DSRC=<source root> -P cmake/CheckLayers.cmake
# (the `layers` test does). Scans the #include lines of libmoe/src, libmoe/include and tools/ and
# fails naming file:line for every include that points up. Layers, lowest first:
set(MOE_LAYERS kernels core backend ops optim comm balance parallel nn models io profile infer
               train tools)
# libmoe/include/moe/<layer>/ and libmoe/src/<layer>/ are one layer; top-level moe/*.h headers and
# src/core/ are core; backend/cpu and backend/cuda are backend; tools/ is the top.
#
# Temporary exceptions, "file -> included header", each with the reason it is still there. Remove
# an entry when the include goes; a stale entry fails the check too, so the list cannot rot.
set(MOE_LAYER_EXCEPTIONS)

if(NOT SRC)
  message(FATAL_ERROR "CheckLayers.cmake: pass -DSRC=<source root>")
endif()

# The layer index of a path relative to the source root (a scanned file), or -1.
function(layer_of_file path out)
  set(layer "")
  if(path MATCHES "^tools/")
    set(layer tools)
  elseif(path MATCHES "^libmoe/include/moe/([a-z_]+)/")
    set(layer ${CMAKE_MATCH_1})
  elseif(path MATCHES "^libmoe/include/moe/[^/]+$")
    set(layer core)
  elseif(path MATCHES "^libmoe/src/([a-z_]+)/")
    set(layer ${CMAKE_MATCH_1})
  endif()
  list(FIND MOE_LAYERS "${layer}" index)
  set(${out} ${index} PARENT_SCOPE)
endfunction()

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

file(GLOB_RECURSE files RELATIVE ${SRC}
  ${SRC}/libmoe/src/*.h ${SRC}/libmoe/src/*.cpp ${SRC}/libmoe/src/*.cu ${SRC}/libmoe/src/*.cuh
  ${SRC}/libmoe/include/*.h ${SRC}/tools/*.h ${SRC}/tools/*.cpp)
list(SORT files)

set(violations "")
set(used_exceptions "")
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
    if("${file} -> ${header}" IN_LIST MOE_LAYER_EXCEPTIONS)
      list(APPEND used_exceptions "${file} -> ${header}")
      continue()
    endif()
    list(GET MOE_LAYERS ${file_layer} from)
    list(GET MOE_LAYERS ${header_layer} to)
    string(APPEND violations "  ${file}:${line_number}: ${from} includes ${to} (${header})\n")
  endforeach()
endforeach()

foreach(exception IN LISTS MOE_LAYER_EXCEPTIONS)
  if(NOT exception IN_LIST used_exceptions)
    string(APPEND violations "  stale exception in cmake/CheckLayers.cmake: ${exception}\n")
  endif()
endforeach()

if(violations)
  string(REPLACE ";" " < " order "${MOE_LAYERS}")
  message(FATAL_ERROR "upward includes (layers: ${order}):\n${violations}")
endif()
list(LENGTH files count)
message(STATUS "layers: ${count} files, no upward include")
