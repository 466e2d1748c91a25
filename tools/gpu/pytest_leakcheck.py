"""pytest plugin (`-p pytest_leakcheck`, with tools/gpu on PYTHONPATH): at exit, before the
interpreter finalises, lists what still holds a backplane.Device (the objects nanobind reports as
leaked when they outlive the module); with LEAK_CLEAR=1 it then empties conftest's device lists,
to tell whether those are what keeps them alive."""
import atexit
import gc
import os
import sys


def _describe(o):
    t = type(o).__name__
    if isinstance(o, dict):
        for name, mod in list(sys.modules.items()):
            if getattr(mod, "__dict__", None) is o:
                return f"module dict {name}"
        keys = list(o.keys())[:6]
        return f"dict keys={keys}"
    if t == "function":
        return f"function {o.__module__}.{o.__qualname__}"
    if t == "frame":
        return f"frame {o.f_code.co_filename}:{o.f_lineno} {o.f_code.co_name}"
    if t == "cell":
        return "cell"
    return f"{t} {repr(o)[:120]}"


def _hunt():
    import backplane as bp
    gc.collect()
    me = sys._getframe()
    devs = []
    holders = []
    for o in gc.get_objects():
        try:
            refs = gc.get_referents(o)
        except Exception:
            continue
        if any(isinstance(r, bp.Device) for r in refs):
            holders.append(o)
    print(f"\nleakhunt: {len(holders)} holders of Device", file=sys.stderr)
    for h in holders[:40]:
        print("  HOLDER", _describe(h), file=sys.stderr)
        for r in gc.get_referrers(h)[:8]:
            if r is holders or r is me:
                continue
            print("     <-", _describe(r), file=sys.stderr)
            for r2 in gc.get_referrers(r)[:4]:
                if r2 is holders or r2 is me:
                    continue
                print("         <-", _describe(r2), file=sys.stderr)
    if os.environ.get("LEAK_CLEAR") == "1":
        conf = sys.modules.get("conftest")
        for name in ("DEVICES", "GPU_DEVICES"):
            lst = getattr(conf, name, None)
            if isinstance(lst, list):
                lst.clear()
        gc.collect()
        print("leakhunt: cleared conftest lists", file=sys.stderr)


def pytest_unconfigure(config):
    atexit.register(_hunt)
