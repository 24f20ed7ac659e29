# Copies the package's .py files into the build tree and removes the .py
# files there that the source no longer has: a renamed module must not stay
# importable from the build (it would hide a missed import).
# Run as: cmake -DSRC=<python/memfit> -DDST=<build/python/memfit> -P sync_package.cmake
file(GLOB_RECURSE built RELATIVE ${DST} ${DST}/*.py)
foreach(f IN LISTS built)
  if(NOT EXISTS ${SRC}/${f})
    file(REMOVE ${DST}/${f})
  endif()
endforeach()
# A moved subpackage's folder goes too: left empty (but for __pycache__),
# it would still import as a namespace package.
file(GLOB_RECURSE dirs LIST_DIRECTORIES true RELATIVE ${DST} ${DST}/*)
foreach(d IN LISTS dirs)
  if(IS_DIRECTORY ${DST}/${d} AND NOT d MATCHES "__pycache__" AND NOT EXISTS ${SRC}/${d})
    file(REMOVE_RECURSE ${DST}/${d})
  endif()
endforeach()
file(COPY ${SRC}/ DESTINATION ${DST})
