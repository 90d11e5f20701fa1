"""Region catalog: benchmark parsing, Parquet store, tourist generator, custom regions (usage:
README.md, "From Python")."""

from optw.catalog.custom import CustomRegionError, build_custom_region
from optw.catalog.generator import VALIDATION_SEED, sample_tourists, validation_tourists
from optw.catalog.parse import SourceError, discover, parse_file
from optw.catalog.region import (
    CUSTOM_GROUP,
    GROUPS,
    PAPER_SUBSET,
    TIME_UNITS_PER_MINUTE,
    Region,
    Tourists,
    round_down,
    to_time_units,
)
from optw.catalog.store import (
    CATALOG_VERSION,
    PROJECT_ROOT,
    TOURIST_SETS,
    Catalog,
    CatalogError,
    add_region,
    build_catalog,
    default_catalog_dir,
    default_source,
    open_catalog,
    read_regions,
    remove_region,
)
from optw.catalog.tourist_json import (
    TouristBatch,
    TouristError,
    TouristInput,
    read_tourist,
    read_tourists,
    tourist_batch,
)

__all__ = [
    "CATALOG_VERSION", "CUSTOM_GROUP", "CustomRegionError", "GROUPS", "PAPER_SUBSET",
    "PROJECT_ROOT", "TIME_UNITS_PER_MINUTE", "TOURIST_SETS", "VALIDATION_SEED", "Catalog",
    "CatalogError", "Region", "SourceError", "TouristBatch", "TouristError", "TouristInput",
    "Tourists", "add_region", "build_catalog", "build_custom_region", "default_catalog_dir",
    "default_source", "discover", "open_catalog", "parse_file", "read_regions", "read_tourist",
    "read_tourists", "remove_region", "round_down", "sample_tourists", "to_time_units",
    "tourist_batch", "validation_tourists",
]
