"""Region catalog: benchmark parsing, Parquet store, tourist generator.

Typical use::

    from optw.catalog import open_catalog, sample_tourists
    cat = open_catalog()
    region = cat.region("c101")             # Region (numpy arrays, node 0 start, n-1 end)
    bench = cat.benchmark("c101")           # Tourists batch of 1
    val = cat.validation("c101")            # Tourists batch of 64
    paper = cat.tourists("c101", "paper")   # the paper's own 64 (a `--paper-sets` catalog;
                                            # generator: optw.catalog.paper_sets)
    new = sample_tourists(region, 1000, rng=0)
    dist = region.distances(new.start_xy)   # [1000, n, n] rounded travel times
    add_region("mycity", "pois.csv")        # a custom region (docs/custom-regions.md)
    batch = read_tourists([{"start": [1, 2], "t_start": 0, "t_end": 600, "scores": [...]}],
                          region)                # validated JSON tourists (TouristError)
"""

from optw.catalog.custom import CustomRegionError, build_custom_region
from optw.catalog.generator import (
    SCORE_KINDS,
    VALIDATION_SEED,
    VALIDATION_SIZE,
    region_rng,
    sample_scores,
    sample_times,
    sample_tourists,
    validation_tourists,
)
from optw.catalog.parse import SourceError, discover, parse_file
from optw.catalog.region import (
    CUSTOM_GROUP,
    DEFAULT_SCORE_KIND,
    GROUPS,
    PAPER_SUBSET,
    TIME_UNITS_PER_MINUTE,
    Region,
    Tourists,
    benchmark_tourist,
    distance_matrix,
    round_down,
    to_time_units,
)
from optw.catalog.store import (
    CATALOG_VERSION,
    PROJECT_ROOT,
    TOURIST_KINDS,
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
    TOURIST_FIELDS,
    TouristBatch,
    TouristError,
    TouristInput,
    read_tourist,
    read_tourists,
    tourist_batch,
)

__all__ = [
    "CATALOG_VERSION", "CUSTOM_GROUP", "CustomRegionError", "DEFAULT_SCORE_KIND", "GROUPS",
    "PAPER_SUBSET", "PROJECT_ROOT", "SCORE_KINDS", "TIME_UNITS_PER_MINUTE", "TOURIST_FIELDS",
    "TOURIST_KINDS", "TOURIST_SETS", "VALIDATION_SEED", "VALIDATION_SIZE", "Catalog",
    "CatalogError", "Region", "SourceError", "TouristBatch", "TouristError", "TouristInput",
    "Tourists", "add_region", "benchmark_tourist", "build_catalog", "build_custom_region",
    "default_catalog_dir", "default_source", "discover", "distance_matrix", "open_catalog",
    "parse_file", "read_regions", "read_tourist", "read_tourists", "region_rng", "remove_region",
    "round_down", "sample_scores", "sample_times", "sample_tourists", "to_time_units",
    "tourist_batch", "validation_tourists",
]
