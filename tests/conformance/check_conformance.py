#!/usr/bin/env python3
"""Runs bp-conformance and checks what it reports, so that a ctest passes when the tool
catches (and names) a deliberately broken plugin.

usage: check_conformance.py TOOL [--expect-exit N] [--expect REGEX]... [--forbid REGEX]...
                            [--only-fail REGEX] [--list-mode] -- TOOL-ARGS...

  --expect REGEX     some output line must match (re.search)
  --forbid REGEX     no output line may match
  --only-fail REGEX  every FAIL line must match (nothing else may fail)
  --list-mode        the run is --list: no JSON/JUnit files to validate

Unless --list-mode, --json and --junit are added and both files are validated: the JSON parses
and has one object per test line with the agreed keys; the JUnit XML parses with one testcase
per test; both agree with the summary line "N passed, M failed, K skipped".
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

STATUSES = ("PASS", "FAIL", "SKIP", "UNSUPPORTED", "XFAIL", "XPASS")
# Test names end with "]": "kernels.add_broadcast[cpu:0,f32]".
LINE = re.compile(r"^(%s) +(\S+?\])(?: |:|$)" % "|".join(STATUSES))
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed, (\d+) skipped$")


def fail(msg, output=None):
    if output is not None:
        sys.stdout.write(output)
        sys.stdout.write("\n---\n")
    sys.stdout.write("check_conformance: FAILED: %s\n" % msg)
    sys.exit(1)


def parse_args(argv):
    if "--" not in argv:
        fail("missing '--' before the tool's arguments")
    cut = argv.index("--")
    mine, tool_args = argv[:cut], argv[cut + 1:]
    opts = {"tool": None, "exit": None, "expect": [], "forbid": [], "only_fail": None,
            "list": False}
    i = 0
    while i < len(mine):
        a = mine[i]
        if a == "--expect-exit":
            opts["exit"] = int(mine[i + 1]); i += 2
        elif a == "--expect":
            opts["expect"].append(mine[i + 1]); i += 2
        elif a == "--forbid":
            opts["forbid"].append(mine[i + 1]); i += 2
        elif a == "--only-fail":
            opts["only_fail"] = mine[i + 1]; i += 2
        elif a == "--list-mode":
            opts["list"] = True; i += 1
        elif opts["tool"] is None:
            opts["tool"] = a; i += 1
        else:
            fail("unknown argument %r" % a)
    if opts["tool"] is None:
        fail("no tool given")
    return opts, tool_args


def validate_reports(lines, summary, json_path, junit_path, output):
    tested = [LINE.match(l) for l in lines]
    tested = [(m.group(1), m.group(2)) for m in tested if m]
    with open(json_path) as f:
        doc = json.load(f)
    tests = doc.get("tests")
    if not isinstance(tests, list):
        fail("JSON: no 'tests' array", output)
    keys = {"name", "suite", "device", "dtype", "status", "message", "seconds"}
    for t in tests:
        if set(t.keys()) != keys:
            fail("JSON: test object keys %s, expected %s" % (sorted(t.keys()), sorted(keys)),
                 output)
        if t["status"].upper() not in STATUSES:
            fail("JSON: bad status %r" % t["status"], output)
        if not isinstance(t["seconds"], (int, float)) or t["seconds"] < 0:
            fail("JSON: bad seconds in %r" % t, output)
        if not t["name"].startswith(t["suite"] + "."):
            fail("JSON: name %r does not start with its suite %r" % (t["name"], t["suite"]),
                 output)
    if [(t["status"].upper(), t["name"]) for t in tests] != tested:
        fail("JSON tests differ from the printed lines (%d vs %d)" % (len(tests), len(tested)),
             output)
    s = doc.get("summary", {})
    if (s.get("passed"), s.get("failed"), s.get("skipped")) != summary:
        fail("JSON summary %r disagrees with the summary line %r" % (s, summary), output)

    root = ET.parse(junit_path).getroot()
    if root.tag != "testsuites":
        fail("JUnit: root element is <%s>" % root.tag, output)
    cases = root.findall("./testsuite/testcase")
    if [c.get("name") for c in cases] != [t["name"] for t in tests]:
        fail("JUnit testcases differ from the JSON tests", output)
    failures = sum(1 for c in cases if c.find("failure") is not None)
    skipped = sum(1 for c in cases if c.find("skipped") is not None)
    if failures != summary[1] or int(root.get("failures")) != summary[1]:
        fail("JUnit failures %d (attribute %s) != %d" % (failures, root.get("failures"),
                                                          summary[1]), output)
    if skipped != summary[2] or int(root.get("skipped")) != summary[2]:
        fail("JUnit skipped %d != %d" % (skipped, summary[2]), output)
    for c in cases:
        f = c.find("failure")
        if f is not None and not f.get("message"):
            fail("JUnit: failure of %s has no message" % c.get("name"), output)


def main():
    opts, tool_args = parse_args(sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="bpc-check-") as tmp:
        json_path = os.path.join(tmp, "report.json")
        junit_path = os.path.join(tmp, "report.xml")
        cmd = [opts["tool"]] + tool_args
        if not opts["list"]:
            cmd += ["--json", json_path, "--junit", junit_path]
        env = dict(os.environ)
        env.pop("BACKPLANE_PLUGIN_PATH", None)
        env.pop("BACKPLANE_PLUGINS", None)
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                              universal_newlines=True, errors="replace")
        output = proc.stdout
        lines = output.splitlines()
        sys.stdout.write("$ %s\n(exit %d, %d lines of output)\n" % (" ".join(cmd), proc.returncode,
                                                                    len(lines)))
        if opts["exit"] is not None and proc.returncode != opts["exit"]:
            fail("exit status %d, expected %d" % (proc.returncode, opts["exit"]), output)
        for rx in opts["expect"]:
            if not any(re.search(rx, l) for l in lines):
                fail("no output line matches %r" % rx, output)
        for rx in opts["forbid"]:
            bad = [l for l in lines if re.search(rx, l)]
            if bad:
                fail("output line matches forbidden %r: %s" % (rx, bad[0]), output)
        if opts["only_fail"] is not None:
            bad = [l for l in lines if l.startswith("FAIL ") and not re.search(opts["only_fail"], l)]
            if bad:
                fail("unexpected failure (allowed: %r): %s" % (opts["only_fail"], bad[0]), output)
        if not opts["list"]:
            sums = [SUMMARY.match(l) for l in lines]
            sums = [m for m in sums if m]
            if len(sums) != 1 or not SUMMARY.match(lines[-1]):
                fail("the last line is not exactly 'N passed, M failed, K skipped'", output)
            summary = tuple(int(x) for x in sums[0].groups())
            if (summary[1] > 0) != (proc.returncode != 0):
                fail("exit status %d disagrees with %d failures" % (proc.returncode, summary[1]),
                     output)
            validate_reports(lines, summary, json_path, junit_path, output)
        for l in lines:
            if l.startswith("FAIL ") or l.startswith("XPASS ") or l.startswith("XFAIL "):
                sys.stdout.write(l + "\n")
        sys.stdout.write(lines[-1] + "\n" if lines else "")
        sys.stdout.write("check_conformance: ok\n")


if __name__ == "__main__":
    main()
