# What scripts/sql-edition does with the SQL edition's sources, sourced by it: the checks of what neither
# wrapper can carry, the entries of the manifest (a file, a glob, `PATH: NAME...`), and the `--@include`
# lines of the upgrade scripts. Needs SRC, PARTS (a scratch directory), FORBIDDEN_TAGS, version, die and
# problem from scripts/sql-edition.

# check_source FILE...: what neither wrapper can carry (see the header). Each finding names FILE: line N...
# (one grep per check, over all the files).
check_source() {
  local tag i
  for tag in "${FORBIDDEN_TAGS[@]}"; do
    found "holds the dollar-quote tag $tag, which the install files reserve" < <(grep -H -n -F -- "$tag" "$@")
  done
  local -a checks=(
    '^[[:space:]]*(BEGIN([[:space:]]+(WORK|TRANSACTION|ISOLATION|READ)\b[^;]*)?|START[[:space:]]+TRANSACTION\b[^;]*|COMMIT([[:space:]]+(WORK|TRANSACTION|PREPARED|AND)\b[^;]*)?|END[[:space:]]+(WORK|TRANSACTION)|ROLLBACK\b[^;]*|ABORT\b[^;]*|SAVEPOINT\b[^;]*|RELEASE\b[^;]*|PREPARE[[:space:]]+TRANSACTION\b[^;]*)[[:space:]]*;'
    'transaction control (an extension script may not hold it; the plain script is one transaction)'
    '^[[:space:]]*\\'
    'a psql meta-command (the scripts do not run through psql)'
    '^[[:space:]]*(CREATE|ALTER|DROP)[[:space:]]+EXTENSION\b'
    'CREATE/ALTER/DROP EXTENSION (nested in an extension script is refused; list needed extensions in requires)'
    '@extowner@|@extschema:'
    '@extowner@ or @extschema:name@ (PostgreSQL 16 and later only)'
  )
  for ((i = 0; i < ${#checks[@]}; i += 2)); do
    # (comment lines aside: a comment may name what a statement may not do)
    found "${checks[i + 1]}" < <(grep -H -n -i -E -- "${checks[i]}" "$@" | grep -v -E '^[^:]*:[0-9]+:[[:space:]]*--')
  done
}
# found MESSAGE: grep -H -n's hits on stdin, one problem per file ("FILE: line N M: MESSAGE").
found() {
  local line
  while IFS= read -r line; do problem "$line: $1"; done < <(awk -F: '
    !($1 in lines) { order[++n] = $1 }
    { lines[$1] = lines[$1] " " $2 }
    END { for (i = 1; i <= n; i++) print order[i] ": line" lines[order[i]] }')
}

# paragraphs FILE NAME...: the paragraphs of FILE that create the objects NAMEd (see the manifest in
# scripts/sql-edition), each followed by a blank line; on stderr what does not hold, and status 1. With
# CODE_ONLY=1 (an upgrade's --@include), only functions, procedures and views count as created: a NAME is
# never matched to a table, type, trigger, index or sequence (a type and a function may share a name), and a
# chosen paragraph that also creates one of those is refused, since the upgrade writes storage by hand.
paragraphs() {
  local file="$1"; shift
  awk -v names="$*" -v file="$file" -v code="${CODE_ONLY:-0}" '
    BEGIN { RS = ""; n = split(names, w, " "); for (i = 1; i <= n; i++) seen[w[i]] = 0 }
    {
      k = split($0, lines, "\n"); hit = 0; other = ""
      for (i = 1; i <= k; i++) {
        l = lines[i]
        if (l !~ /^CREATE /) continue
        sub(/^CREATE (OR REPLACE )?/, "", l)
        kind = ""
        while (l ~ /^[A-Z]+ /) { kind = kind " " substr(l, 1, index(l, " ") - 1); sub(/^[A-Z]+ /, "", l) }  # VIEW, UNIQUE INDEX, ...
        name = l; sub(/[ (].*$/, "", name)
        if (code && kind !~ /^ (FUNCTION|PROCEDURE|VIEW)$/) other = other " " name " (" substr(kind, 2) ")"
        else if (name in seen) { seen[name]++; hit = 1 } else other = other " " name
      }
      if (!hit) next
      if (other != "") bad = bad "\n" file ": the paragraph at " lines[1] " also creates" other ", not named"
      out = out $0 "\n\n"
    }
    END {
      for (x in seen) if (seen[x] != 1) bad = bad "\n" file ": " seen[x] " paragraphs create " x ", not 1"
      if (bad != "") { print substr(bad, 2) > "/dev/stderr"; exit 1 }
      printf "%s", out
    }' "$file"
}

# storage_lines FILE: the lines of FILE that start (in the first column) a statement that creates or changes
# something other than a function, procedure or view; none for a file an upgrade may --@include whole.
storage_lines() {
  grep -n -E '^(CREATE[[:space:]]|ALTER|INSERT|UPDATE|DELETE|TRUNCATE|DROP|COPY)\b' "$1" \
    | grep -v -E '^[0-9]+:CREATE[[:space:]]+(OR[[:space:]]+REPLACE[[:space:]]+)?(FUNCTION|PROCEDURE|VIEW)\b'
}

# resolve_entry ENTRY WHERE: the files of one manifest entry (a path relative to SRC, a glob of them, or
# `PATH: NAME...`), appended to the array `resolved`; WHERE names the entry in messages. With CODE_ONLY=1,
# as an upgrade's --@include takes them: code paragraphs only (paragraphs), a whole file only when it
# creates nothing but functions, procedures and views, and CREATE FUNCTION/PROCEDURE/VIEW at the start of a
# line made CREATE OR REPLACE, in copies under PARTS.
part_no=0
resolve_entry() {
  local entry="$1" where="$2" path f matched=0 part bad
  local -a names
  if [[ "$entry" == *:* ]]; then
    path="${entry%%:*}"; read -r -a names <<<"${entry#*:}"
    [ -f "$SRC/$path" ] || die "$where: no $SRC/$path"
    [ ${#names[@]} -gt 0 ] || die "$where: no object named"
    part_no=$((part_no + 1)); part="$PARTS/$(printf '%02d' "$part_no")-$(basename "$path")"
    paragraphs "$SRC/$path" "${names[@]}" >"$part" || die "$where: see above"
    [ "${CODE_ONLY:-0}" != 1 ] || sed -i -E 's/^CREATE (FUNCTION|PROCEDURE|VIEW) /CREATE OR REPLACE \1 /' "$part"
    resolved+=("$part")
    return
  fi
  for f in "$SRC"/$entry; do   # (a glob, or one path)
    [ -f "$f" ] || continue
    matched=1
    if [ "${CODE_ONLY:-0}" != 1 ]; then resolved+=("$f"); continue; fi
    if bad="$(storage_lines "$f")"; then
      die "$where: ${f#"$SRC"/} creates or changes storage (line $(head -1 <<<"$bad")): include its functions and views by name (PATH: NAME...) and write the storage changes by hand"
    fi
    part_no=$((part_no + 1)); part="$PARTS/$(printf '%02d' "$part_no")-$(basename "$f")"
    sed -E 's/^CREATE (FUNCTION|PROCEDURE|VIEW) /CREATE OR REPLACE \1 /' "$f" >"$part"
    resolved+=("$part")
  done
  [ "$matched" = 1 ] || die "$where names $entry, which is not in $SRC"
}

# expand_includes SCRIPT TO: the upgrade SCRIPT (to version TO) on stdout, each line `--@include ENTRY`
# followed by what the entry resolves to (resolve_entry, CODE_ONLY=1; the copies also appended to the array
# `included`, for check_source). Only the script to the sources' version may include: the sources hold that
# version's definitions, not an older one's.
expand_includes() {
  local script="$1" to="$2" line n=0 f
  local -a resolved
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    printf '%s\n' "$line"
    [[ "$line" =~ ^--@include[[:space:]]+(.*[^[:space:]])[[:space:]]*$ ]] || continue
    [ "$to" = "$version" ] || die "$script: line $n: --@include in an upgrade to $to: only the upgrade to the sources' version ($version) may include, since the sources define $version (write the included text in, as scripts/sql-edition --expand printed it when $to was the sources' version)"
    resolved=()
    CODE_ONLY=1 resolve_entry "${BASH_REMATCH[1]}" "$script: line $n: --@include"
    included+=("${resolved[@]}")
    for f in "${resolved[@]}"; do
      cat "$f"
      [ -z "$(tail -c1 "$f")" ] || printf '\n'
    done
  done <"$script"
}
