"""IPython magics: thin wrappers that parse arguments, call the library and display.

``%load_ext pyc_lab`` registers them (and prints nothing); ``%unload_ext pyc_lab``
removes them again.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from .errors import PycLabError

__all__ = ["PycLabMagics", "register", "unregister"]


@magics_class
class PycLabMagics(Magics):
    """pyc_lab's magics."""

    @magic_arguments()
    @argument("--snapshot", "-s", metavar="PATH",
              help="show a saved profile (a JSON path or a shipped name: h200, dgx-h100) "
                   "instead of probing this machine")
    @argument("--bandwidth", "-b", action="store_true",
              help="also measure copy bandwidths (H2D/D2H pageable and pinned, D2D, peer; "
                   "host memcpy only without a GPU); takes a few seconds")
    @line_magic
    def pyc_hw(self, line: str) -> Any:
        """Show the machine's topology: NUMA nodes, CPUs, GPUs, links, PCIe bandwidths.

        Examples::

            %pyc_hw
            %pyc_hw --bandwidth
            %pyc_hw --snapshot dgx-h100
        """
        from .runtime import detect_hardware, probe_bandwidth
        from .widgets import TopologyWidget

        args = parse_argstring(self.pyc_hw, line)
        try:
            profile = detect_hardware(snapshot=args.snapshot)
            bandwidth = None
            if args.bandwidth:
                if args.snapshot:
                    raise PycLabError(
                        "--bandwidth measures this machine and cannot be combined with "
                        "--snapshot; drop one of them"
                    )
                bandwidth = probe_bandwidth(profile=profile)
        except PycLabError as exc:
            # A bad argument is the user's to fix: a one-line message, not a traceback.
            raise UsageError(f"%pyc_hw: {exc}") from exc
        display(TopologyWidget(profile, bandwidth))
        return None


def register(ipython: Any) -> None:
    """Register the magics with an IPython shell."""
    ipython.register_magics(PycLabMagics)


def unregister(ipython: Any) -> None:
    """Remove the magics registered by :func:`register`."""
    manager = ipython.magics_manager
    for kind in ("line", "cell"):
        table = manager.magics[kind]
        for name in list(PycLabMagics.magics[kind]):
            table.pop(name, None)
    manager.registry.pop(PycLabMagics.__name__, None)
