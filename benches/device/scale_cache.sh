#!/usr/bin/env bash
# The shared compile cache on the GPU machine (issue 34, part 2): a zoo model composed by two
# hosts in turn over one sccache backend, each with a fresh fact build cache and sccache server;
# $OUT/scale/cache.json holds both wall times, shared_cache_vs_cold (second / first) and the
# second host's sccache hits and misses (benches/device/scale_cache.py says what runs).
# Stage here first (the GPU machine has neither sccache nor Redis, and reaches no registry):
#   cargo build --release && ../shared/tools/device-stage && bash benches/device/stage-sccache.sh
# Then on the GPU machine, from the repository root (about 5 minutes for gpt2):
#   source .device/env.sh && bash benches/device/scale_cache.sh [--model gpt2] [--policy bf16] [--with-direct]
# The backend is the staged redis-server (Debian's, with its libraries) on 127.0.0.1:6390, or,
# where none is staged or it does not start, a disk folder both hosts share (cache.json says
# which and why).
set -uo pipefail
out=${OUT:?set OUT to the folder results go to}/scale
tools=/tmp/fact-sccache
mkdir -p "$out" "$tools"
[ -f .device/sccache.xz ] || { echo "scale_cache: no .device/sccache.xz: run benches/device/stage-sccache.sh here first" >&2; exit 1; }
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
  .device/sccache.xz "$tools/sccache" && chmod +x "$tools/sccache"
redis=() pid=
if [ -f .device/redis.tar.xz ]; then
  rm -rf "$tools/redis" && mkdir -p "$tools/redis"
  python3 -m tarfile -e .device/redis.tar.xz "$tools/redis"
  if LD_LIBRARY_PATH="$tools/redis/lib" "$tools/redis/redis-server" --bind 127.0.0.1 --port 6390 \
       --save '' --appendonly no --daemonize yes --pidfile "$tools/redis.pid" --logfile "$out/redis.log"; then
    sleep 1
    pid=$(cat "$tools/redis.pid" 2>/dev/null)
    redis=(--redis redis://127.0.0.1:6390)
  else
    redis=(--redis-note "the staged redis-server did not start (see redis.log)")
  fi
else
  redis=(--redis-note "no redis-server staged (benches/device/stage-sccache.sh found none)")
fi
python3 benches/device/scale_cache.py "$out" --sccache "$tools/sccache" "${redis[@]}" "$@"
rc=$?
[ -n "$pid" ] && kill "$pid" 2>/dev/null
exit $rc
