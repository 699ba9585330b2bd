#!/usr/bin/env bash
# The main job: a sample project with a failing test is put in a sandbox,
# forked three ways while it runs a service, each fork tries a different
# fix with the tests run in all three at once, and the one that passes is
# promoted back to the project. Every tine command is printed with its
# time. The state is left in place; the last lines say how to look at it
# and how to clean it up.
#
# Environment: TINE (the tine binary; default bin/tine beside this
# folder), TINE_DEMO_DIR (where the demo works; default /tmp/tine-demo).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${TINE:-$here/../bin/tine}
work=${TINE_DEMO_DIR:-/tmp/tine-demo}
root=$work/root
project=$work/project
go=$(command -v go || echo /usr/local/go/bin/go)

ms() { date +%s%N | cut -c1-13; }
tine() { "$bin" --root "$root" "$@"; }

# shown prints its arguments as a shell would read them back.
shown() {
	local out="" a
	for a in "$@"; do
		if [[ $a =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then out+=" $a"; else out+=" $(printf '%q' "$a")"; fi
	done
	printf '%s' "${out# }"
}

# step prints the tine command it runs (on the demo's own output, even
# when the command's output is redirected) and how long it took.
exec 3>&1
declare -a timings=()
step() {
	local cmd
	cmd="tine $(shown "$@")"
	printf '\n$ %s\n' "$cmd" >&3
	local t0 rc=0
	t0=$(ms)
	tine "$@" || rc=$?
	local took=$(($(ms) - t0))
	printf '  [%d ms]\n' "$took" >&3
	timings+=("$(printf '%6d ms  %.70s' "$took" "$cmd")")
	return $rc
}
say() { printf '\n## %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
	echo "demo: the ns runtime needs root (namespaces, FUSE, cgroups); run it as root" >&2
	exit 1
fi

# A fresh start: stop a daemon left by an earlier run, then remove its state.
if [ -S "$root/tine.sock" ]; then
	tine serve --stop >/dev/null 2>&1 || true
fi
rm -rf "$work"
mkdir -p "$work"
cp -r "$here/project" "$project"
git -C "$project" init -q -b main
git -C "$project" -c user.name=demo -c user.email=demo@example.com add -A
git -C "$project" -c user.name=demo -c user.email=demo@example.com commit -qm "mean: first version"
tine init >/dev/null

say "A sandbox of $project, running a web server on port 8080 as a service"
step create --from "$project" --name agent --env HOME=/root \
	--service "busybox httpd -f -p 8080 -h $project"
say "The project's tests fail in it"
step exec agent --cwd "$project" -- "$go" test ./... || true

say "Three forks of the running sandbox: same files, the service started again in each"
step fork agent -n 3 --names try-1,try-2,try-3

say "A different change in each fork (the file goes in on stdin)"
step exec -i try-1 --cwd "$project" -- tee mean.go <"$here/ideas/try-1.go.txt" >/dev/null
step exec -i try-2 --cwd "$project" -- tee mean.go <"$here/ideas/try-2.go.txt" >/dev/null
step exec try-3 --cwd "$project" -- rm mean_test.go

say "The tests in all three at once, each isolated"
t0=$(ms)
for f in try-1 try-2 try-3; do
	(tine exec "$f" --cwd "$project" -- "$go" test ./... >"$work/$f.out" 2>&1 || true) &
done
wait
printf '$ tine exec try-{1,2,3} -- go test ./...   (in parallel)\n  [%d ms for all three]\n' $(($(ms) - t0))
timings+=("$(printf '%6d ms  three test runs in parallel' $(($(ms) - t0)))")
for f in try-1 try-2 try-3; do
	printf -- '--- %s\n' "$f"
	sed 's/^/    /' "$work/$f.out"
done

say "What runs in one fork, and the same port open in each without a collision"
step ps try-1
for f in try-1 try-2 try-3; do step ports "$f"; done

say "What each fork changed, deletions included"
for f in try-1 try-2 try-3; do step diff "$f"; done

say "A snapshot, a mistake, and a rollback"
step snapshot try-1 --name good
step exec try-1 --cwd "$project" -- sh -c 'echo broken > mean.go'
step diff try-1 good
step rollback try-1 good
step diff try-1 good

# The winner passes its tests and keeps them: try-3 "passes" only because
# its test file is gone ("no test files").
winner=""
for f in try-1 try-2 try-3; do
	if grep -q '^ok' "$work/$f.out" && ! grep -q 'no test files' "$work/$f.out"; then
		winner=$f
		break
	fi
done
if [ -z "$winner" ]; then
	echo "demo: no fork passed its tests" >&2
	exit 1
fi
say "Promote $winner, the fork that passes and keeps its tests, into $project"
step promote "$winner" --dry-run
step promote "$winner"
printf '\n$ git -C %s status --short\n' "$project"
git -C "$project" status --short
printf '\n$ go test ./...   (on the host, in %s)\n' "$project"
(cd "$project" && GOFLAGS= "$go" test ./...)

say "Timings"
printf '%s\n' "${timings[@]}"

say "The state is left in place"
cat <<EOF
Look at it:   $bin --root $root ls
              $bin --root $root status try-1
Clean it up:  $bin --root $root serve --stop && rm -rf $work
EOF
