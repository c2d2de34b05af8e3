# Note [The header check's precompiled prefixes]
# Every public header compiles on its own, twice in one translation unit, with
# the warnings on. Parsing LibTorch's headers is nearly all of each unit's
# time, so each unit starts from a precompiled LibTorch header, which is sound
# where the header itself includes that LibTorch header: what its own text
# sees is then the same with or without it, and each fulgor header it goes
# through is checked on its own. The prefix of a header is the first LibTorch
# header it includes, directly or through fulgor's headers, outside any
# #if (fulgor_header_prefix); the headers that reach no LibTorch header have
# none. A prefix that several headers share is one object library with its
# own precompiled header, made under the check's flags.

# The first LibTorch header (<torch/...>, <ATen/...>, <c10/...>) that the
# public header ${header} (relative to include/) includes unconditionally,
# in include order, or "" where it includes none.
function(fulgor_header_prefix header out)
  get_property(known GLOBAL PROPERTY fulgor_prefix_${header} SET)
  if(known)
    get_property(prefix GLOBAL PROPERTY fulgor_prefix_${header})
    set(${out} "${prefix}" PARENT_SCOPE)
    return()
  endif()
  set(prefix "")
  file(STRINGS ${PROJECT_SOURCE_DIR}/include/${header} lines REGEX "^[ \t]*#[ \t]*(if|endif|include)")
  set(depth 0)
  foreach(line IN LISTS lines)
    if(line MATCHES "^[ \t]*#[ \t]*if")
      math(EXPR depth "${depth} + 1")
    elseif(line MATCHES "^[ \t]*#[ \t]*endif")
      math(EXPR depth "${depth} - 1")
    elseif(depth EQUAL 0 AND line MATCHES "#[ \t]*include[ \t]*<((torch|ATen|c10)/[^>]+)>")
      set(prefix "${CMAKE_MATCH_1}")
    elseif(depth EQUAL 0 AND line MATCHES "#[ \t]*include[ \t]*\"(fulgor/[^\"]+)\"")
      fulgor_header_prefix(${CMAKE_MATCH_1} prefix)
    endif()
    if(prefix)
      break()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY fulgor_prefix_${header} "${prefix}")
  set(${out} "${prefix}" PARENT_SCOPE)
endfunction()

# One object library of check units, at -O0 without debug information: nothing
# is left to do but parse.
function(fulgor_header_check_unit name)
  add_library(${name} OBJECT ${ARGN})
  target_link_libraries(${name} PRIVATE fulgor)
  target_compile_options(${name} PRIVATE -O0 -g0 -Wall -Wextra)
  add_dependencies(fulgor_header_check ${name})
endfunction()

# Adds fulgor_header_check, the target that builds one check unit per public
# header, in object libraries: one per prefix that three headers or more share
# (fulgor_header_check_<prefix>), since a precompiled header costs as much to
# make as a unit without one, and to load a third as much; the rest in
# fulgor_header_check_plain, without one.
function(fulgor_add_header_check)
  file(GLOB_RECURSE headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/include
       ${PROJECT_SOURCE_DIR}/include/fulgor/*.h)
  set(prefixes "")
  set(plain "")
  foreach(header IN LISTS headers)
    fulgor_header_prefix(${header} prefix)
    string(REGEX REPLACE "[/.]" "_" stem ${header})
    set(source ${CMAKE_CURRENT_BINARY_DIR}/header_check/${stem}.cpp)
    file(CONFIGURE OUTPUT ${source} CONTENT "#include \"${header}\"\n#include \"${header}\"\n")
    if(prefix)
      string(MAKE_C_IDENTIFIER "${prefix}" key)
      list(APPEND prefixes ${prefix})
      list(APPEND sources_${key} ${source})
    else()
      list(APPEND plain ${source})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES prefixes)
  add_custom_target(fulgor_header_check ALL)
  foreach(prefix IN LISTS prefixes)
    string(MAKE_C_IDENTIFIER "${prefix}" key)
    list(LENGTH sources_${key} count)
    if(count GREATER_EQUAL 3)
      fulgor_header_check_unit(fulgor_header_check_${key} ${sources_${key}})
      target_precompile_headers(fulgor_header_check_${key} PRIVATE <${prefix}>)
    else()
      list(APPEND plain ${sources_${key}})
    endif()
  endforeach()
  fulgor_header_check_unit(fulgor_header_check_plain ${plain})
endfunction()
