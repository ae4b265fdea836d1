"""Build pyc_lab/data/snapshots/dgx-h100.json from public facts about an NVIDIA DGX H100.

This snapshot is *constructed*, not recorded: no such machine was available. Each fact
comes from public NVIDIA material and the sources in the profile say so:

- NVIDIA DGX H100 User Guide / datasheet: 2x Intel Xeon Platinum 8480C (56 cores each,
  2 threads per core), 2 TB of system memory, 8x H100 SXM5 80 GB, 4x NVSwitch with 18
  NVLink 4 links per GPU (900 GB/s bidirectional per GPU), PCIe Gen5 x16 to the host.
- H100 SXM5 (NVIDIA H100 datasheet, CUDA programming guide): compute capability 9.0,
  132 SMs, 80 GB HBM3 on a 5120-bit bus (3.35 TB/s), SM boost clock 1980 MHz.
- ``nvidia-smi topo -m`` as published for DGX H100: every GPU pair NV18; GPUs 0-3 on
  NUMA node 0 (CPUs 0-55,112-167), GPUs 4-7 on NUMA node 1 (CPUs 56-111,168-223); the
  PCI bus ids 18, 2a, 3a, 5d, 9a, ab, ba, db.

Run from the repository root: ``python scripts/make_dgx_h100_snapshot.py``.
"""

from __future__ import annotations

from pathlib import Path

from pyc_lab import __version__
from pyc_lab.hardware.profile import GPUInfo, HardwareProfile, HostInfo, LinkInfo, NumaNode

SRC_SYSTEM = "public: NVIDIA DGX H100 User Guide"
SRC_GPU = "public: NVIDIA H100 SXM5 datasheet"
SRC_TOPO = "public: nvidia-smi topo -m on DGX H100"

OUT = Path(__file__).resolve().parents[1] / "pyc_lab" / "data" / "snapshots" / "dgx-h100.json"


def build() -> HardwareProfile:
    """The DGX H100 profile."""
    node0 = [*range(0, 56), *range(112, 168)]
    node1 = [*range(56, 112), *range(168, 224)]
    half_memory = 2**40  # 32 x 64 GiB DIMMs = 2 TiB, split over the two sockets
    host = HostInfo(
        cpu_model="Intel(R) Xeon(R) Platinum 8480C",
        architecture="x86_64",
        sockets=2,
        cores=112,
        threads=224,
        memory_total_bytes=2 * 2**40,
        numa_nodes=[NumaNode(0, node0, half_memory), NumaNode(1, node1, half_memory)],
        os=None,
    )
    host.sources = {k: SRC_SYSTEM for k in
                    ("cpu_model", "architecture", "sockets", "cores", "threads",
                     "memory_total_bytes", "numa_nodes")}
    buses = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
    gpus = []
    for i, bus in enumerate(buses):
        g = GPUInfo(
            index=i,
            name="NVIDIA H100 80GB HBM3",
            uuid=None,
            pci_bus_id=f"0000:{bus}:00.0",
            compute_capability="9.0",
            sm_count=132,
            memory_total_bytes=81559 * 2**20,
            memory_bus_width_bits=5120,
            clock_sm_max_mhz=1980,
            clock_mem_max_mhz=2619,
            pcie_gen_max=5,
            pcie_width_max=16,
            numa_node=0 if i < 4 else 1,
            cpu_affinity=node0 if i < 4 else node1,
            mig_mode="disabled",
            nvlink_version=4,
        )
        g.sources = {k: SRC_GPU for k in ("name", "compute_capability", "sm_count",
                                           "memory_total_bytes", "memory_bus_width_bits",
                                           "clock_sm_max_mhz", "clock_mem_max_mhz",
                                           "nvlink_version")}
        g.sources.update({k: SRC_TOPO for k in ("pci_bus_id", "numa_node", "cpu_affinity")})
        g.sources.update({k: SRC_SYSTEM for k in ("pcie_gen_max", "pcie_width_max",
                                                   "mig_mode")})
        gpus.append(g)
    links = [
        LinkInfo(a, b, kind="NV18", nvlinks=18, p2p=True,
                 sources={"kind": SRC_TOPO, "nvlinks": SRC_SYSTEM, "p2p": SRC_SYSTEM})
        for a in range(8) for b in range(a + 1, 8)
    ]
    return HardwareProfile(
        host=host,
        gpus=gpus,
        links=links,
        driver_version=None,
        cuda_driver_version=None,
        cuda_status="8 CUDA device(s)",
        providers={"public facts": "constructed by scripts/make_dgx_h100_snapshot.py"},
        origin="constructed",
        recorded_at=None,
        pyc_lab_version=__version__,
        description="NVIDIA DGX H100 (8x H100 SXM5, NVSwitch), built from public facts, "
                    "not recorded on a machine",
    )


if __name__ == "__main__":
    build().to_json(OUT)
    print(f"wrote {OUT}")
