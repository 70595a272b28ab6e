"""The component's entry module for componentize-py.

The `flow-engine` world exports one interface, `engine`, whose only item is
the `flow` resource: componentize-py looks for the interface's class here and
for the resource's class in the module named after the interface
(`engine.py`).
"""

from wit_world import exports


class Engine(exports.Engine):
    pass
