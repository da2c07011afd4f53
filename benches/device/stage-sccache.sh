#!/usr/bin/env bash
# Stages sccache and a Redis server into .device/ (git ignores it; it travels with the working
# tree) for benches/device/scale_cache.sh: the GPU machine has neither and reaches no registry.
# Run here, from the repository root, after ./setup and ../shared/tools/device-stage:
#   bash benches/device/stage-sccache.sh
# Writes .device/sccache.xz (the pinned venv's binary, or $FACT_SCCACHE; xz'd: 22 MB becomes 7) and
# .device/redis.tar.xz (Debian's redis-server with every library it links except glibc's own
# libc, libm, libstdc++ and libgcc_s, which any x86-64 Linux has; about 4 MB). Without
# redis-server here (apt-get install redis-server), only sccache is staged and scale_cache.sh
# uses a disk folder as the shared backend.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
mkdir -p .device
scc=${FACT_SCCACHE:-$(readlink -f .fact/sccache 2>/dev/null || true)}
[ -x "$scc" ] || scc=$(command -v sccache || true)
[ -x "$scc" ] || { echo "stage-sccache: no sccache (./setup installs it)" >&2; exit 1; }
xz -T0 -6 -c "$scc" > .device/sccache.xz
echo "stage-sccache: $("$scc" --version) from $scc"
if server=$(command -v redis-server); then
  tmp=$(mktemp -d)
  mkdir -p "$tmp/lib"
  cp -L "$server" "$tmp/redis-server"
  for lib in $(ldd "$server" | awk '/=> \//{print $3}'); do
    case $(basename "$lib") in
      libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*) ;;
      *) cp -L "$lib" "$tmp/lib/" ;;
    esac
  done
  tar -C "$tmp" -cJf .device/redis.tar.xz .
  rm -rf "$tmp"
  echo "stage-sccache: $("$server" --version | cut -d' ' -f1-3) with $(tar -tJf .device/redis.tar.xz | grep -c '^./lib/.') libraries"
else
  rm -f .device/redis.tar.xz
  echo "stage-sccache: no redis-server here; scale_cache.sh will share a disk folder instead"
fi
du -sh .device | awk '{print "stage-sccache: .device/ holds " $1 " (the carry limit is 64 MiB)"}'
