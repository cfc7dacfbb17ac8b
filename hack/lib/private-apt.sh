# Sourced by the scripts that take Debian packages for the test tiers
# (kernel-deps.sh, virt-deps.sh). private_apt DIR sets up an apt
# configuration under DIR that lists bookworm and bookworm-backports from the
# mirror the host already uses, with a copy of the host's dpkg status (so apt
# computes what the host lacks), and defines papt, pcache, missing and fetch.
# Nothing of the host's apt sources or state is touched. Needs die and log.

private_apt() {
  local dir=$1
  for tool in apt-get apt-cache dpkg-deb sha256sum flock; do
    command -v "$tool" >/dev/null || die "needs '$tool' on the host (Debian: apt-get install ${tool/sha256sum/coreutils}); it is missing"
  done
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  [[ -f $keyring ]] || die "needs $keyring (Debian package debian-archive-keyring) to verify the archive"
  # The Debian mirror the host already uses for bookworm (override: VFNET_DEBIAN_MIRROR).
  mirror=${VFNET_DEBIAN_MIRROR:-}
  if [[ -z $mirror ]]; then
    mirror=$(apt-cache policy 2>/dev/null | awk '$3 == "bookworm/main" && $4 == "amd64" {print $2; exit}')
  fi
  if [[ -z $mirror ]]; then
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null |
      grep -oE '(https?|file)://[^ ]+' | grep -v -- '-security' | grep -m1 '/debian/\?$' || true)
  fi
  [[ -n $mirror ]] || die "no Debian bookworm mirror found in the host's apt sources; set VFNET_DEBIAN_MIRROR=<url of a Debian archive>"
  mirror=${mirror%/}
  APT_DIR=$dir
  mkdir -p "$dir"/apt/{etc/sources.list.d,etc/preferences.d,state/lists/partial,cache/archives/partial} "$dir/debs"
  cat >"$dir/apt/etc/sources.list" <<EOS
deb [signed-by=$keyring] $mirror bookworm main
deb [signed-by=$keyring] $mirror bookworm-backports main
EOS
  if [[ -f /var/lib/dpkg/status ]]; then cp /var/lib/dpkg/status "$dir/apt/state/status"; else : >"$dir/apt/state/status"; fi
  apt_opts=(
    -o "Dir::Etc::SourceList=$dir/apt/etc/sources.list"
    -o "Dir::Etc::SourceParts=$dir/apt/etc/sources.list.d"
    -o "Dir::Etc::Preferences=$dir/apt/etc/preferences"
    -o "Dir::Etc::PreferencesParts=$dir/apt/etc/preferences.d"
    -o "Dir::State=$dir/apt/state"
    -o "Dir::State::status=$dir/apt/state/status"
    -o "Dir::Cache=$dir/apt/cache"
    -o "APT::Install-Recommends=false"
    -o "Acquire::Retries=3"
  )
  log "updating a private package index (bookworm, bookworm-backports from $mirror)"
  papt update --error-on=any >"$dir/apt/update.log" 2>&1 ||
    { cat "$dir/apt/update.log" >&2; die "apt-get update of the private index (bookworm, bookworm-backports at $mirror) failed (see above)"; }
}

papt() { apt-get -q "${apt_opts[@]}" "$@"; }
pcache() { apt-cache "${apt_opts[@]}" "$@"; }

# missing ARGS...: the packages apt would install for `apt-get install ARGS`
# on the host, as pkg=version lines.
missing() {
  local out
  out=$(papt -s install "$@" 2>&1) || { echo "$out" >&2; die "cannot resolve packages: $* (see apt's words above)"; }
  sed -n 's/^Inst \([^ ]*\) \(\[[^]]*\] \)\?(\([^ ]*\) .*/\1=\3/p' <<<"$out"
}

# fetch ROOT pkg=version...: downloads (cached in $APT_DIR/debs) and unpacks
# the packages into ROOT, replacing it whole.
fetch() {
  local root=$1; shift
  rm -rf "$root.tmp"; mkdir -p "$root.tmp"
  local p deb
  for p in "$@"; do
    [[ -n $p ]] || continue
    # The C library comes from the host: a private copy would not match its loader.
    case ${p%%=*} in libc6 | libc-bin | libgcc-s1 | libstdc++6) continue ;; esac
    deb=$(ls "$APT_DIR/debs/${p%%=*}_${p#*=}"_*.deb 2>/dev/null | head -1 || true)
    deb=${deb:-$(ls "$APT_DIR/debs/${p%%=*}_${p#*=*:}"_*.deb 2>/dev/null | head -1 || true)}
    if [[ -z $deb ]]; then
      (cd "$APT_DIR/debs" && papt download "$p" >/dev/null 2>"$APT_DIR/debs/download.err") ||
        { cat "$APT_DIR/debs/download.err" >&2; die "cannot download Debian package $p from $mirror"; }
      deb=$(ls -t "$APT_DIR/debs/${p%%=*}_"*.deb | head -1)
    fi
    dpkg-deb -x "$deb" "$root.tmp" || die "cannot unpack $deb"
  done
  rm -rf "$root"; mv "$root.tmp" "$root"
}
