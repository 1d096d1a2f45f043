"""Finding drivers: the `ringsnap.drivers` entry-point group, in-tree drivers included.

One code path for every driver: a distribution declares

    [project.entry-points."ringsnap.drivers"]
    ontap = "ringsnap.plugins.ontap.driver:OntapDriver"

Discovery reads the entry points without importing anything; a driver's module is imported only
when an array's config names it, so a driver whose vendor SDK is not installed costs nothing until
it is used, and then says which extra to install.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from ringsnap.errors import ConfigError, RingsnapError
from ringsnap.plugins.api import ArrayDriver
from ringsnap.plugins.middleware import RetryPolicy, WrappedDriver, wrap

ENTRY_POINT_GROUP = "ringsnap.drivers"


class DriverLoadError(RingsnapError):
    """A driver is installed but cannot be used: duplicate name, broken import, wrong type."""

    exit_code = 70  # EX_SOFTWARE


class MissingExtraError(DriverLoadError):
    """A driver's optional vendor SDK is not installed; the message names the extra."""

    exit_code = 69  # EX_UNAVAILABLE

    def __init__(self, driver: str, module: str, extra: str | None, distribution: str) -> None:
        self.driver = driver
        self.module = module
        self.extra = extra
        if extra:
            hint = f"install it with: pip install '{distribution}[{extra}]'"
        else:
            hint = f"install the package that provides {module!r}"
        super().__init__(f"driver {driver!r} needs the Python module {module!r}; {hint}")


@dataclass(frozen=True)
class DriverEntry:
    """One registered driver, not yet imported."""

    name: str
    #: "module:Class"
    target: str
    distribution: str


def discover() -> dict[str, DriverEntry]:
    """Every registered driver by name. Two distributions claiming one name is an error."""
    found: dict[str, DriverEntry] = {}
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = entry_point.dist.name if entry_point.dist is not None else "<unknown distribution>"
        entry = DriverEntry(entry_point.name, entry_point.value, dist)
        previous = found.get(entry.name)
        if previous is not None and previous != entry:
            raise DriverLoadError(
                f"driver name {entry.name!r} is registered twice: by {previous.distribution!r}"
                f" ({previous.target}) and by {entry.distribution!r} ({entry.target});"
                " uninstall one of them"
            )
        found[entry.name] = entry
    return found


def known_drivers() -> list[str]:
    return sorted(discover())


def load_driver_class(name: str) -> type[ArrayDriver]:
    """Import the driver registered as `name`.

    Raises KeyError for an unknown name (callers turn it into a ConfigError),
    MissingExtraError when its vendor SDK is absent, DriverLoadError for anything else.
    """
    entry = discover()[name]
    module_name, _, attribute = entry.target.partition(":")
    try:
        loaded: Any = metadata.EntryPoint(name, entry.target, ENTRY_POINT_GROUP).load()
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and not _is_within(missing, module_name) and not missing.startswith("ringsnap"):
            raise MissingExtraError(
                name, missing, _extra_providing(entry.distribution, missing), entry.distribution
            ) from exc
        raise DriverLoadError(
            f"driver {name!r} from distribution {entry.distribution!r}: cannot import"
            f" {entry.target}: {exc}"
        ) from exc
    except Exception as exc:
        raise DriverLoadError(
            f"driver {name!r} from distribution {entry.distribution!r}: importing"
            f" {entry.target} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not (isinstance(loaded, type) and issubclass(loaded, ArrayDriver)):
        raise DriverLoadError(
            f"driver {name!r} from distribution {entry.distribution!r}: {entry.target} is not"
            " a subclass of ringsnap.plugins.api.ArrayDriver"
        )
    if getattr(loaded, "name", None) != name:
        raise DriverLoadError(
            f"driver {name!r} from distribution {entry.distribution!r}: {module_name}.{attribute}"
            f".name is {getattr(loaded, 'name', None)!r}; it must equal its entry-point name"
        )
    return loaded


def build_driver(array: str, settings: Mapping[str, Any], *, source: str) -> ArrayDriver:
    """Build the driver for one array from its config table (`[arrays.<array>]`).

    `settings["driver"]` selects the driver; the rest of the table goes to its `from_config`.
    Config errors name `source` and the key as `arrays.<array>.<key>`.
    """
    prefix = f"arrays.{array}"
    driver_name = settings.get("driver")
    known = known_drivers()
    if not isinstance(driver_name, str) or not driver_name:
        raise ConfigError(
            source, f"{prefix}.driver", f"required: one of {', '.join(known) or '(none installed)'}"
        )
    try:
        driver_class = load_driver_class(driver_name)
    except KeyError:
        raise ConfigError(
            source,
            f"{prefix}.driver",
            f"unknown driver {driver_name!r}; known drivers: {', '.join(known) or '(none)'}",
        ) from None
    rest = {key: value for key, value in settings.items() if key != "driver"}
    try:
        return driver_class.from_config(array, rest, source=source)
    except ConfigError as exc:
        if exc.key is not None and exc.key.startswith(prefix):
            raise
        key = f"{prefix}.{exc.key}" if exc.key else prefix
        raise ConfigError(exc.file, key, exc.problem) from None


def open_driver(
    array_name: str,
    settings: Mapping[str, Any],
    source: str,
    *,
    retry: RetryPolicy | None = None,
) -> WrappedDriver:
    """Build the array's driver and wrap it in the middleware (retries, timing, logs)."""
    return wrap(build_driver(array_name, settings, source=source), retry=retry)


def _is_within(module: str, package_path: str) -> bool:
    """Whether `module` is the driver's own module or one of its parents (a broken install)."""
    return package_path == module or package_path.startswith(module + ".")


_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _extra_providing(distribution: str, module: str) -> str | None:
    """The extra of `distribution` whose requirements provide the top-level `module`."""
    top = module.split(".", maxsplit=1)[0]
    try:
        requirements = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return None
    for requirement in requirements:
        project, _, marker = requirement.partition(";")
        extra = _EXTRA_MARKER.search(marker)
        if extra is None:
            continue
        project_name = re.split(r"[\s<>=!~\[(]", project.strip(), maxsplit=1)[0]
        if _normalise(project_name) == _normalise(top) or top in _top_level_modules(project_name):
            return extra.group(1)
    return None


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _top_level_modules(project: str) -> set[str]:
    """Import names an installed project provides (empty if it is not installed)."""
    try:
        files = metadata.files(project) or []
    except metadata.PackageNotFoundError:
        return set()
    return {file.parts[0].removesuffix(".py") for file in files if file.parts}
