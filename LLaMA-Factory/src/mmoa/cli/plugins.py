"""Commands that other installed packages add to a command group of ``mmoa-cli``.

The library never imports the demo-only package ``mmoa_demo`` (nor any other optional one), yet
``mmoa-cli data demo-world`` is the command its users know. The standard Python plugin
mechanism joins them: a distribution declares an entry point in the group ``mmoa.cli.<group>``
(pyproject.toml, ``[project.entry-points."mmoa.cli.data"]``) naming a function
``register(parser, commands)`` that adds its sub-commands to the group's parser. Without such a
distribution installed the group has only the library's commands.
"""

from __future__ import annotations

import argparse
from importlib.metadata import EntryPoint, distributions

from mmoa.cli.common import Commands

#: The entry-point group of the plugins of one command group (``data`` -> ``mmoa.cli.data``).
GROUP_PREFIX = "mmoa.cli."


def add_plugin_commands(group: str, parser: argparse.ArgumentParser, commands: Commands) -> None:
    """Let every installed plugin of ``group`` add its commands (in entry-point name order, so
    ``--help`` lists them the same way every time)."""
    for point in plugin_entry_points(group):
        point.load()(parser, commands)


def plugin_entry_points(group: str) -> list[EntryPoint]:
    """The entry points of ``mmoa.cli.<group>`` of every distribution on the path, one per name.

    Not ``importlib.metadata.entry_points``: it reads only the first metadata found per
    distribution name, and a stale ``mmoa_rag.egg-info`` left in the source folder (first on
    ``sys.path`` under pytest) would hide the installed one's plugins."""
    found: dict[str, EntryPoint] = {}
    for dist in distributions():
        for point in dist.entry_points.select(group=GROUP_PREFIX + group):
            found.setdefault(point.name, point)
    return [found[name] for name in sorted(found)]
