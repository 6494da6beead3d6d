#!/usr/bin/env python3
"""Checks compare_topology.py (run_multi_gpu.sh's topodiag vs nvidia-smi check) on this host, on
nvidia-smi output written in the driver's layout (tabs, ANSI underline header, " X " cells, NIC
legend) and small topodiag JSON documents. Run: python3 tests/gpu/test_compare_topology.py"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_topology as ct  # noqa: E402

# nvidia-smi topo -m of a 2-GPU virtual machine: GPUs joined by NV18, no NUMA node from the kernel.
SMI_VM = ("\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
          "GPU0\t X \tNV18\t0-31\t0\t\tN/A\n"
          "GPU1\tNV18\t X \t0-31\t0\t\tN/A\n"
          "\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n")
SMI_VM_NUMA_NA = SMI_VM.replace("0-31\t0\t", "0-31\tN/A\t")
CSV_VM = "0, 00000000:00:06.0\n1, 00000000:00:07.0\n"


def diag_vm(relation="NV18", numa=0, numa_nodes=1):
    return {
        "numa": [{"os_index": i, "subtype": None} for i in range(numa_nodes)],
        "gpus": [{"index": 0, "busid": "0000:00:06.0", "numa": numa, "cpus": "0-31"},
                 {"index": 1, "busid": "0000:00:07.0", "numa": numa, "cpus": "0-31"}],
        "nics": [],
        "matrix": {"GPU0": {"GPU0": "X", "GPU1": relation},
                   "GPU1": {"GPU0": relation, "GPU1": "X"}},
    }


# a quarter of a DGX H100: 2 GPUs, their 2 NICs, 2 NUMA nodes
SMI_NIC = ("\t\x1b[4mGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
           "GPU0\t X \tNV18\tPIX\tSYS\t0-55,112-167\t0\t\tN/A\n"
           "GPU1\tNV18\t X \tSYS\tPIX\t56-111,168-223\t1\t\tN/A\n"
           "NIC0\tPIX\tSYS\t X \tSYS\t\t\t\t\n"
           "NIC1\tSYS\tPIX\tSYS\t X \t\t\t\t\n"
           "\nLegend:\n\n  X    = Self\n\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_3\n")
CSV_NIC = "0, 00000000:1B:00.0\n1, 00000000:9D:00.0\n"


def diag_nic():
    labels = ["GPU0", "GPU1", "NIC0", "NIC1"]
    cells = [["X", "NV18", "PIX", "SYS"], ["NV18", "X", "SYS", "PIX"],
             ["PIX", "SYS", "X", "SYS"], ["SYS", "PIX", "SYS", "X"]]
    return {
        "numa": [{"os_index": 0, "subtype": None}, {"os_index": 1, "subtype": None}],
        "gpus": [{"index": 0, "busid": "0000:1b:00.0", "numa": 0, "cpus": "0-55,112-167"},
                 {"index": 1, "busid": "0000:9d:00.0", "numa": 1, "cpus": "56-111,168-223"}],
        "nics": [{"index": 0, "name": "mlx5_0"}, {"index": 1, "name": "mlx5_3"}],
        "matrix": {a: dict(zip(labels, row)) for a, row in zip(labels, cells)},
    }


def failed(checks):
    return sorted(name for name, good, _ in checks if not good)


class CompareTopology(unittest.TestCase):
    def test_vm_agrees(self):
        self.assertEqual(failed(ct.compare(SMI_VM, CSV_VM, diag_vm())), [])

    def test_relation_difference_is_found(self):
        self.assertEqual(failed(ct.compare(SMI_VM, CSV_VM, diag_vm(relation="PHB"))),
                         ["GPU0-GPU1 relation"])

    def test_gpu_order_difference_is_found(self):
        swapped = "0, 00000000:00:07.0\n1, 00000000:00:06.0\n"
        self.assertEqual(failed(ct.compare(SMI_VM, swapped, diag_vm())),
                         ["GPU0 bus id (order)", "GPU1 bus id (order)"])

    def test_numa_na_agrees_only_with_the_single_node(self):
        self.assertEqual(failed(ct.compare(SMI_VM_NUMA_NA, CSV_VM, diag_vm())), [])
        self.assertEqual(failed(ct.compare(SMI_VM_NUMA_NA, CSV_VM, diag_vm(numa_nodes=2))),
                         ["GPU0 NUMA", "GPU1 NUMA"])
        self.assertEqual(failed(ct.compare(SMI_VM_NUMA_NA, CSV_VM, diag_vm(numa=None))), [])

    def test_numa_number_difference_is_found(self):
        self.assertEqual(failed(ct.compare(SMI_VM, CSV_VM, diag_vm(numa=1, numa_nodes=2))),
                         ["GPU0 NUMA", "GPU1 NUMA"])

    def test_nics_cpus_and_names(self):
        self.assertEqual(failed(ct.compare(SMI_NIC, CSV_NIC, diag_nic())), [])
        d = diag_nic()
        d["nics"][1]["name"] = "mlx5_1"
        d["gpus"][1]["cpus"] = "56-111"
        d["matrix"]["GPU1"]["NIC1"] = "NODE"
        self.assertEqual(failed(ct.compare(SMI_NIC, CSV_NIC, d)),
                         ["GPU1 CPU affinity", "GPU1-NIC1 relation", "NIC1 name"])

    def test_missing_gpu_is_found(self):
        d = diag_vm()
        del d["gpus"][1]
        self.assertIn("GPU count", failed(ct.compare(SMI_VM, CSV_VM, d)))

    def test_unparsable_output_raises(self):
        with self.assertRaises(ValueError):
            ct.compare("No devices were found\n", "", diag_vm())


if __name__ == "__main__":
    unittest.main(verbosity=2)
