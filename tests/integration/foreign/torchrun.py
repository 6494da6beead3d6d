#!/usr/bin/env python3
"""torchrun (torch.distributed.run) as Debian's python3-torch 1.13 ships it, made to start on
Python 3.11: its Std.from_str finds a redirect value by iterating the IntFlag Std, and since
Python 3.11 that iteration skips 0 (NONE) and composite members (ALL), so the default
`--redirects 0` becomes None and to_map() fails with "'NoneType' object has no attribute 'get'".
This wrapper replaces that lookup with Std(int(value)) and runs torch.distributed.run unchanged.

usage: torchrun.py [torchrun's arguments...]
"""
import re
import runpy
import sys

from torch.distributed.elastic.multiprocessing import api


def std_from_str(vm):
    if re.match(api._VALUE_REGEX, vm):
        return api.Std(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")


api.Std.from_str = staticmethod(std_from_str)
sys.argv = ["torchrun"] + sys.argv[1:]
runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
