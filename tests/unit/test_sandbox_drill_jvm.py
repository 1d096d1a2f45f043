"""The sandbox's drill host starts its drill nodes with the ring's JIT: C1 only when the ring's
nodes run quick (the tests' default), the JVM's default JIT when a benchmark asks for full."""

from __future__ import annotations

from ringsnap.sandbox.image import java17_flags
from ringsnap.sandbox.stack import drill_jvm_options

QUICK = "-XX:TieredStopAtLevel=1"


def test_quick_drill_nodes_run_c1_only_with_cassandras_java_flags() -> None:
    options = drill_jvm_options("quick")
    assert options[: len(java17_flags())] == java17_flags()
    assert options.count(QUICK) == 1


def test_full_drill_nodes_keep_the_jvms_jit() -> None:
    assert drill_jvm_options("full") == java17_flags()
    assert QUICK not in drill_jvm_options("full")
