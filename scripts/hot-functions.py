# gdb's part of scripts/hot-functions.sh: run leasewrap to its end with a one-shot breakpoint on
# every function of its text, and write the name of each function reached, once, in the order
# reached, after "W " when the watchdog reached it. HOT_FUNCTIONS lists "ADDRESS NAME"
# (addresses from the link map, before the binary is placed in memory), HOT_OUT is the file
# written, HOT_FOLLOW is "parent" (leasewrap) or "child": the watchdog from the fork on, every
# breakpoint set again there (it also runs functions leasewrap ran before the fork), never the
# child it starts.
import os

import gdb

out = open(os.environ["HOT_OUT"], "w")
follow = os.environ.get("HOT_FOLLOW", "parent")
for setting in ("pagination off", "confirm off", "detach-on-fork on",
                "breakpoint always-inserted on", "follow-fork-mode " + follow):
    gdb.execute("set " + setting)
gdb.execute("starti", to_string=True)
leasewrap = gdb.selected_inferior().pid
base = None
for line in gdb.execute("info proc mappings", to_string=True).splitlines():
    f = line.split()
    if len(f) >= 5 and f[-1].endswith("/leasewrap") and int(f[3], 16) == 0:
        base = int(f[0], 16)
        break
if base is None:
    raise gdb.GdbError("hot-functions: leasewrap's text is not mapped")


class Reached(gdb.Breakpoint):
    """A breakpoint that writes its function's name the first time it is reached."""

    def __init__(self, address, name):
        super().__init__("*0x%x" % address, internal=True)
        self.function = name

    def stop(self):
        forked = gdb.selected_inferior().pid != leasewrap
        out.write(("W " if forked else "") + self.function + "\n")
        out.flush()
        self.enabled = False
        return False


breakpoints = []
for line in open(os.environ["HOT_FUNCTIONS"]):
    address, name = line.split()
    breakpoints.append(Reached(base + int(address, 16), name))
if follow == "child":
    gdb.execute("catch fork")
    gdb.execute("continue")
    for b in breakpoints:
        b.enabled = True
    gdb.execute("stepi")
    gdb.execute("set follow-fork-mode parent")
gdb.execute("continue")
out.close()
