#!/usr/bin/env bash
# cold_build.sh: ON or OFF, whether make's build here is cold, so compiles
# in unity batches (Note [Unity builds]). ON where ccache has nothing to
# give a build: not installed, or its cache empty (a new machine, CI's cold
# caches); there batches save a third of a cold build's CPU and half its
# wall time. OFF where ccache holds objects: a rebuild from its cache beats
# any batch, and an edited file recompiles alone, not with its batch.
# CCACHE_DISABLE set: ccache gives nothing either.
if [ -z "${CCACHE_DISABLE:-}" ] && command -v ccache >/dev/null &&
  ccache --print-stats 2>/dev/null | awk '$1 == "files_in_cache" && $2 > 0 {f = 1} END {exit !f}'; then
  echo OFF
else
  echo ON
fi
