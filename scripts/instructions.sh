#!/bin/sh
# Instructions per round trip of benchmarks/remote's paths, counted by
# valgrind's callgrind: exact and repeatable on a noisy machine, where
# wall-clock latency moves by more than the cuts it is to judge.
#
#   scripts/instructions.sh [binary] [path] [n1] [n2]
#
# binary: a build of benchmarks/remote (default: built now into
# $TMPDIR/tf-instructions/remote); path: one path name (default
# tensorferry); n1 < n2: round-trip counts of the two runs (default 20000
# and 60000). The figures are (run n2 − run n1) / (n2 − n1), so set-up and
# tear-down cancel. Each function's own instructions (callgrind's self
# cost) are put in one of three groups:
#
#   path      everything the round trip runs in user space outside the
#             scheduler and the collector: our code, msgp, protoactor,
#             allocation, the system-call wrappers;
#   runtime   the scheduler, timers, the garbage collector's marking and
#             sweeping, clock reads: work that valgrind's serialised
#             threads and its slowness (a round trip takes ~200 µs under
#             it) inflate, so it is shown but not compared;
#   total     both.
#
# The kernel's work (the system calls themselves) is not counted.
# GOMAXPROCS=2 and no read spin (the default below 8 processors), as on the
# 2-core dev machine. Needs valgrind (Debian: apt-get install valgrind).
set -eu
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
work="${TMPDIR:-/tmp}/tf-instructions"
mkdir -p "$work"
bin="${1:-}"
path="${2:-tensorferry}"
n1="${3:-20000}"
n2="${4:-60000}"
if [ -z "$bin" ]; then
	bin="$work/remote"
	CGO_ENABLED=0 go build -C benchmarks -o "$bin" ./remote
fi
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind not found" >&2; exit 1; }

run() { # run COUNT: callgrind's per-function self costs into $work/self-COUNT.txt
	out="$work/cg-$path-$1.out"
	GODEBUG=asyncpreemptoff=1 GOMAXPROCS=2 valgrind --tool=callgrind --callgrind-out-file="$out" \
		"$bin" --paths "$path" --rtt-count "$1" --oneway-count 1 >"$work/run-$path-$1.log" 2>&1 ||
		{ echo "instructions.sh: run of $1 round trips failed, see $work/run-$path-$1.log" >&2; exit 1; }
	callgrind_annotate --auto=no --inclusive=no --threshold=100 "$out" >"$work/self-$path-$1.txt"
}
run "$n1"
run "$n2"

# The runtime group: scheduling, timers, the collector and the clock.
awk -v n1="$n1" -v n2="$n2" -v path="$path" '
function fn(line,   f) {
	f = line
	sub(/^[ \t]*[0-9,]+ \([^)]*\)[ \t]+/, "", f)
	sub(/ \[.*$/, "", f)
	sub(/^[^:]*:/, "", f)
	sub(/'"'"'[0-9]+$/, "", f)
	return f
}
function cost(line,   c) { c = line; sub(/^[ \t]*/, "", c); sub(/ .*/, "", c); gsub(/,/, "", c); return c + 0 }
/^[ \t]*[0-9,]+ \(/ && /:/ {
	f = fn($0)
	if (f == "" || f ~ /PROGRAM TOTALS/) next
	if (FILENAME ~ ("-" n1 "\\.txt$")) a[f] += cost($0); else b[f] += cost($0)
	seen[f] = 1
}
END {
	rt = "^runtime\\.(unlock2|lock2|findRunnable|casgstatus|gosched|schedule|wakep|execute|globrunq|runq|bgsweep|bgscavenge|freeDead|sweep|freeSomeWbufs|\\(\\*timers\\)|mcall|park_m|\\(\\*m\\)|pidle|\\(\\*gcControllerState\\)|gcBgMarkWorker|gcDrain|gcMark|scanObject|scanobject|scanblock|scanSpan|tryDeferToSpanScan|extractHeapBits|greyobject|markBits|\\(\\*spanInlineMarkBits\\)|wbBuf|spanSet|\\(\\*mspan\\)\\.sweep|nanotime|netpoll|stealWork|checkTimers|ready|goready|notewakeup|futex|mPark|stopm|startm|handoff|resetspinning|gopark|gogo|save|\\(\\*timeHistogram\\)|runtimeNano|mput|mget|injectglist|nobarrierWakeTime|checkdead|sysmon|usleep|osyield|procyield|retake|preemptone|semacquire|semrelease|lockWithRank|unlockWithRank|gcstopm|gcFlushBgCredit|gcParkAssist)"
	for (f in seen) {
		d = (b[f] - a[f]) / (n2 - n1)
		if (f ~ rt || f == "gogo" || f ~ /^time\.(now|Now|Since|runtimeNano)$/) runtime += d; else { p += d; own[f] = d }
	}
	printf "%s: instructions per round trip (callgrind, runs of %d and %d)\n", path, n1, n2
	printf "  path     %8.0f\n  runtime  %8.0f\n  total    %8.0f\n", p, runtime, p + runtime
	printf "largest in path:\n"
	n = 0
	for (f in own) { keys[++n] = f }
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (own[keys[j]] > own[keys[i]]) { t = keys[i]; keys[i] = keys[j]; keys[j] = t }
	for (i = 1; i <= n && i <= 40; i++) printf "  %8.0f  %s\n", own[keys[i]], keys[i]
}' "$work/self-$path-$n1.txt" "$work/self-$path-$n2.txt"
