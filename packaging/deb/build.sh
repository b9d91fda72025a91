#!/usr/bin/env bash
# Builds the xvs Debian package from built binaries:
#   packaging/deb/build.sh BIN_DIR OUT_DIR
# BIN_DIR holds xvs, xvsadm and xvs-docs (cargo's release or debug folder);
# the package is written to OUT_DIR/xvs_<version>_<arch>.deb and its path
# printed. `make deb` runs it on the release build.
#
# What it installs: /usr/sbin/xvs and /usr/sbin/xvsadm, the systemd unit,
# /etc/xvs/xvs.toml (a conffile: an upgrade keeps the operator's edits),
# tmpfiles.d for /run/xvs, the man pages and shell completions generated
# from the programs' own definitions (xvs-docs), the README. postinst
# enables and starts nothing: the operator writes the config first.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${1:?usage: build.sh BIN_DIR OUT_DIR}
out=${2:?usage: build.sh BIN_DIR OUT_DIR}
for b in xvs xvsadm xvs-docs; do
  [ -x "$bin/$b" ] || { echo "build.sh: $bin/$b missing (cargo build -p xvs-control --bins)" >&2; exit 2; }
done

version=$("$bin/xvs" --version | awk '{print $2}')
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg="$stage/xvs"

install -d "$pkg/DEBIAN" "$pkg/usr/sbin" "$pkg/lib/systemd/system" "$pkg/etc/xvs" \
  "$pkg/usr/lib/tmpfiles.d" "$pkg/usr/share/doc/xvs" "$pkg/usr/share/man/man5" \
  "$pkg/usr/share/man/man8" "$pkg/usr/share/bash-completion/completions" \
  "$pkg/usr/share/zsh/vendor-completions" "$pkg/usr/share/fish/vendor_completions.d"

install -m 0755 -s "$bin/xvs" "$bin/xvsadm" "$pkg/usr/sbin/"
# The unit as shipped, with the package's paths.
sed -e 's|/usr/local/bin/xvs|/usr/sbin/xvs|g' \
    -e 's|^# /usr/local/bin and the config in /etc/xvs/xvs.toml, then:|# /usr/sbin (this package) and the config in /etc/xvs/xvs.toml, then:|' \
    -e 's|^Documentation=\(.*\)$|Documentation=man:xvs(8) man:xvs.toml(5) \1|' \
    "$root/packaging/xvs.service" > "$pkg/lib/systemd/system/xvs.service"
chmod 0644 "$pkg/lib/systemd/system/xvs.service"
install -m 0644 "$here/xvs.toml" "$pkg/etc/xvs/xvs.toml"
echo "/etc/xvs/xvs.toml" > "$pkg/DEBIAN/conffiles"
echo "d /run/xvs 0750 root root -" > "$pkg/usr/lib/tmpfiles.d/xvs.conf"
chmod 0644 "$pkg/usr/lib/tmpfiles.d/xvs.conf"

docs="$stage/docs"
"$bin/xvs-docs" "$docs" > /dev/null
for p in "$docs"/man/man5/*.5; do gzip -9n -c "$p" > "$pkg/usr/share/man/man5/$(basename "$p").gz"; done
for p in "$docs"/man/man8/*.8; do gzip -9n -c "$p" > "$pkg/usr/share/man/man8/$(basename "$p").gz"; done
install -m 0644 "$docs"/completions/bash/* "$pkg/usr/share/bash-completion/completions/"
install -m 0644 "$docs"/completions/zsh/* "$pkg/usr/share/zsh/vendor-completions/"
install -m 0644 "$docs"/completions/fish/* "$pkg/usr/share/fish/vendor_completions.d/"
install -m 0644 "$root/README.md" "$pkg/usr/share/doc/xvs/README.md"
cp "$here/copyright" "$pkg/usr/share/doc/xvs/copyright"
chmod 0644 "$pkg/usr/share/doc/xvs/copyright"
printf 'xvs (%s) unstable; urgency=medium\n\n  * Release %s.\n\n -- xvs maintainers <maintainers@xvs.example.org>  %s\n' \
  "$version" "$version" "$(date -R -d @"${SOURCE_DATE_EPOCH:-0}")" | gzip -9n > "$pkg/usr/share/doc/xvs/changelog.gz"

install -m 0755 "$here/postinst" "$pkg/DEBIAN/postinst"
size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" \
  "$here/control" > "$pkg/DEBIAN/control"

find "$pkg" -type d -exec chmod 0755 {} +
mkdir -p "$out"
deb="$out/xvs_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" > /dev/null
echo "$deb"
