# Copies the package's .py files into the build tree and removes the .py
# files there that the source no longer has: a renamed module must not stay
# importable from the build (it would hide a missed import).
# KEEP: files the build writes there itself (_build_info.py).
# Run as: cmake -DSRC=<python/memfit> -DDST=<build/python/memfit> [-DKEEP=a.py;b.py] -P sync_package.cmake
file(GLOB_RECURSE built RELATIVE ${DST} ${DST}/*.py)
foreach(f IN LISTS built)
  if(NOT EXISTS ${SRC}/${f} AND NOT f IN_LIST KEEP)
    file(REMOVE ${DST}/${f})
  endif()
endforeach()
file(COPY ${SRC}/ DESTINATION ${DST})
