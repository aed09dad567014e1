# Sourced by the measuring scripts, so that each keeps one current results
# file, benchmarks/results/NAME.md, named after it and rewritten by its
# every run:
#   record NAME "VAR ..." "$@"   after $tmp exists and before any output:
#       from here on the script's standard output goes to the terminal and
#       to $tmp/results.md, which starts with the command line (the named
#       environment variables that are set, the script, its arguments), the
#       date, the commit and the machine.
#   record_end                  as the script's last step: puts that file in
#       place. A run that fails or is interrupted leaves the last complete
#       measurement as it was.
record() {
  local name=$1 vars=$2 v a cmd=""
  shift 2
  for v in $vars; do
    [ -n "${!v:-}" ] && cmd+="$v=$(record_quote "${!v}") "
  done
  cmd+="scripts/$name.sh"
  for a in "$@"; do cmd+=" $(record_quote "$a")"; done
  record_file=benchmarks/results/$name.md
  record_tmp=${tmp:?record needs \$tmp}/results.md
  local rev dirty=""
  rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && dirty=" with uncommitted changes"
  {
    printf '# scripts/%s.sh\n\n' "$name"
    printf 'Command: `%s`\n\n' "$cmd"
    printf 'Date: %s, commit %s%s; %s CPUs (%s), %s\n\n' "$(date -u '+%F %H:%M UTC')" "$rev" "$dirty" \
      "$(nproc)" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" "$(go version 2>/dev/null | cut -d' ' -f3)"
    printf '```\n'
  } >"$record_tmp"
  # Background processes that the script starts hold the pipe open as long
  # as they run, so the end of the record is a line of its own (record_end
  # waits for it) rather than the end of the pipe.
  record_mark="record-end-$$-$RANDOM"
  exec 3>&1 > >(record_copy)
  record_open=1
  # A run that ends early gives its standard output back too, before the
  # script's own EXIT trap waits for its children.
  local prev
  prev=$(trap -p EXIT)
  if [ -n "$prev" ]; then eval "set -- $prev"; prev=$3; fi
  trap "record_close; $prev" EXIT
}

# record_copy copies its input to its output and to the record, line by
# line as it comes, until the end mark.
record_copy() {
  local line
  while IFS= read -r line || [ -n "$line" ]; do
    if [ "$line" = "$record_mark" ]; then
      : >"$record_tmp.done"
      continue
    fi
    printf '%s\n' "$line"
    printf '%s\n' "$line" >>"$record_tmp"
  done
}

# record_close gives the script its standard output back.
record_close() {
  if [ "${record_open:-}" = 1 ]; then
    record_open=
    exec 1>&3 3>&-
  fi
}

# record_quote quotes a word for the command line as a shell would read it.
record_quote() {
  case $1 in
    *[!A-Za-z0-9_./:=,+@%-]*|'') printf '"%s"' "${1//\"/\\\"}" ;;
    *) printf '%s' "$1" ;;
  esac
}

record_end() {
  echo "$record_mark"
  record_close
  local i
  for i in $(seq 100); do [ -e "$record_tmp.done" ] && break; sleep 0.05; done
  printf '```\n' >>"$record_tmp"
  mkdir -p "$(dirname "$record_file")"
  cp "$record_tmp" "$record_file"
  echo "wrote $record_file"
}
