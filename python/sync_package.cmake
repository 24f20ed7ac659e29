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
file(COPY ${SRC}/ DESTINATION ${DST})
