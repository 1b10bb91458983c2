#!/usr/bin/env bash
# A CPython >= 3.14 for the `ups attach --inject` test (sys.remote_exec, PEP 768), on a box whose
# Debian release has none (bookworm: 3.11). It takes Debian sid's python3.14 packages and the
# libraries they need, unpacks them under PREFIX (dpkg -x: nothing is installed, the host's
# packages, libc and apt state are untouched), points the interpreter at sid's own loader and
# libraries (patchelf), and links PREFIX/usr/bin/python3.14 as /usr/local/bin/python3.14.
#
#   bash scripts/get_python314.sh [PREFIX]        (default /opt/py314; needs root, patchelf)
#
# It ends with the interpreter's own answer to `hasattr(sys, "remote_exec")`. Any step that
# fails ends the script non-zero and leaves no link behind: the test then skips, as GPU tests do.
set -euo pipefail
prefix=${1:-/opt/py314}
command -v python3.14 >/dev/null 2>&1 && python3.14 -I -S -c 'import sys; sys.exit(not hasattr(sys, "remote_exec"))' && exit 0
command -v patchelf >/dev/null 2>&1 || apt-get install -y -qq patchelf >/dev/null 2>&1 \
  || { apt-get update -qq && apt-get install -y -qq patchelf >/dev/null; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main" >"$work/sources.list"
touch "$work/status"
apto=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$work/lists"
      -o "Dir::Cache::Archives=$work/archives" -o "Dir::State::status=$work/status" -o APT::Sandbox::User=root)
apt-get "${apto[@]}" update -qq
# The interpreter, its standard library, and the shared libraries its binary and stdlib modules load.
(cd "$work/archives" && apt-get "${apto[@]}" download -qq python3.14 python3.14-minimal libpython3.14-minimal \
  libpython3.14-stdlib libc6 libexpat1 zlib1g libssl3t64 libffi8 libbz2-1.0 liblzma5 libsqlite3-0 libncursesw6 \
  libtinfo6 libreadline8t64 libuuid1 libzstd1 libgcc-s1 libcrypt1 libmpdec4 media-types netbase tzdata)
rm -rf "$prefix.new"
mkdir -p "$prefix.new"
for deb in "$work"/archives/*.deb; do dpkg -x "$deb" "$prefix.new"; done
lib="$prefix/usr/lib/x86_64-linux-gnu"
patchelf --set-interpreter "$lib/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$lib:$prefix/lib/x86_64-linux-gnu" \
  "$prefix.new/usr/bin/python3.14"
rm -rf "$prefix"
mv "$prefix.new" "$prefix"
"$prefix/usr/bin/python3.14" -I -S -c 'import sys, ctypes, json, subprocess; assert hasattr(sys, "remote_exec"); print(sys.version.split()[0])'
ln -sf "$prefix/usr/bin/python3.14" /usr/local/bin/python3.14
echo "python3.14 -> $prefix/usr/bin/python3.14 (sys.remote_exec: yes)"
