#!/usr/bin/env bash
# pch_default.sh: ON or OFF, whether make's build precompiles torch's headers
# (Note [Precompiled torch headers]). ON where ccache has nothing to give a
# build: not installed, or its cache empty (a new machine, CI's cold
# caches); there precompiled headers save most of a cold build's CPU. OFF
# where ccache holds objects: a rebuild from its cache beats any header, and
# GCC's precompiled headers make every object uncacheable.
if command -v ccache >/dev/null &&
  ccache --print-stats 2>/dev/null | awk '$1 == "files_in_cache" && $2 > 0 {f = 1} END {exit !f}'; then
  echo OFF
else
  echo ON
fi
