"""e2b 2.45.1, the SDK that refuses a key not of E2B's form (`e2b_` and
hex) before sending anything, against `hearth up` with the key `hearth up`
printed as E2B_API_KEY (the same secret as LANGSMITH_API_KEY, with E2B's
prefix). Run by crates/hearth-cli/tests/cli/vm/sdk.rs with E2B_API_KEY,
E2B_API_URL, E2B_SANDBOX_URL, HEARTH_LANGSMITH_KEY (the `hth_` form) and
HEARTH_E2B_TEMPLATE.

Each test prints PASS or FAIL; the exit status is 1 if any failed.
"""

import os
import sys
import traceback

import e2b
from e2b import Sandbox
from e2b.exceptions import AuthenticationException

TEMPLATE = os.environ.get("HEARTH_E2B_TEMPLATE", "base")


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def test_the_printed_key_passes_the_sdk_check_and_works():
    key = os.environ["E2B_API_KEY"]
    check(key.startswith("e2b_"), f"hearth up printed {key[:6]}…")
    e2b.api.validate_api_key(key)
    sb = Sandbox.create(template=TEMPLATE, timeout=120)
    try:
        out = sb.commands.run("echo $((6*7))")
        check(out.stdout == "42\n", repr(out.stdout))
        sb.files.write("/tmp/hello.txt", "from 2.45.1")
        check(sb.files.read("/tmp/hello.txt") == "from 2.45.1", "read back")
        ids = [s.sandbox_id for s in Sandbox.list().next_items()]
        check(sb.sandbox_id in ids, f"{sb.sandbox_id} not in {ids}")
    finally:
        sb.kill()
    check(not sb.is_running(), "still running after kill")


def test_the_langsmith_form_is_refused_by_this_sdk_alone():
    # Why the e2b_ form exists: 2.45.1 never sends an hth_ key.
    try:
        Sandbox.create(template=TEMPLATE, api_key=os.environ["HEARTH_LANGSMITH_KEY"])
    except AuthenticationException as e:
        check("e2b_" in str(e), str(e))
    else:
        raise AssertionError("2.45.1 sent an hth_ key")


def test_a_wrong_key_of_the_right_form_is_refused_by_hearth():
    try:
        Sandbox.create(template=TEMPLATE, api_key="e2b_" + "0" * 40)
    except AuthenticationException as e:
        check("401" in str(e) or "key" in str(e).lower(), str(e))
    else:
        raise AssertionError("a made-up key was accepted")


def main():
    failed = 0
    tests = [(n, f) for n, f in globals().items() if n.startswith("test_")]
    for name, fn in tests:
        try:
            fn()
            print(f"PASS {name}", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL {name}", flush=True)
            traceback.print_exc()
    print(f"{len(tests) - failed}/{len(tests)} passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
