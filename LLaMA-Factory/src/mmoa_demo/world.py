"""A seeded synthetic encyclopedia and multi-hop QA set: the embedded demo world.

The demo must exercise everything the real task has, on a 2-core CPU and with no download:
retrieval among look-alike passages, multi-hop questions whose second hop is only reachable
through a fact found in the first passage, comparisons, yes/no questions, and gold answers that
a word-overlap labeller gets wrong some of the time. So the world is not a list of isolated facts:

* entities (countries, cities, people, companies, films) are linked by relations, and each
  entity's passage mentions its neighbours (a director's passage names their films, a film's
  passage names its director and studio), which is what makes bridge questions retrievable;
* distractor passages share names and words with real ones: namesakes with the same surname,
  novels with a film's title, festival and exhibition notes that mention people, places, films and
  years without stating the facts that questions ask about.

Questions are generated per split from disjoint pools of subject entities, so a test question
never has the subject of a training question: a model must read, not remember.
Everything is driven by one ``random.Random(seed)``; the same configuration gives the same world
byte for byte.

**The hard world (opt-in).** In the default world a question's top 10 rarely holds more than one
passage that looks like its answer: the Query Rewriter and the Selector have little to do, unlike
on HotpotQA, where the ten candidates are full of same-name pages. Two options make retrieval with
K = 10 hard:

* ``namesakes_per_entity`` (``--hard`` sets 3) adds, for every entity that a question asks
  about (every entity of a question's ``supporting_ids``), that many passages that share its name
  and kind: people of the same surname with a similar first name and the same occupation, films,
  plays and TV series of the same title, companies with the same short name, towns and countries
  named after it, its family, foundation, university or station. Each states the asked facts for
  the other, similarly named entity (another birthplace and year, another director, another
  capital) or states none of them; none names the entity's *bridge neighbours* (a film's director
  and studio, a person's birthplace, a company's headquarters), so a bridge question's second hop
  is still found only through the first. :attr:`DemoWorld.namesakes` says which passages imitate
  which gold passage (it is not written to disk).
* ``distractor_share`` (default 0.3) is the share of ``n_passages`` that are generic distractors
  (novels, festivals, exhibitions, random namesakes); raising it gives fewer entities and more
  noise.

Namesake passages come on top of ``n_passages`` and are drawn from a random stream of their own,
after the questions: the hard world of a configuration is its default world (the same entities,
questions, answers and gold passages' text) plus the namesakes, with passage ids renumbered. So
the oracle ("the Generator given the gold passages") scores the same on both, and any difference
between them is retrieval and selection. **The defaults must leave the default world byte for
byte unchanged**, because the demo's published figures were measured on it: with
``namesakes_per_entity=0`` and ``distractor_share=0.3`` no new random draw is made, and
``world.json`` records the two options only when they differ from their defaults.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mmoa.fileio import atomic_dir, atomic_write_json, atomic_write_jsonl

SPLITS = ("train", "dev", "test")
QUESTION_TYPES = ("one_hop", "bridge", "comparison", "yes_no")
#: Share of each question type in every split (sums to 1).
TYPE_MIX = {"one_hop": 0.3, "bridge": 0.3, "comparison": 0.2, "yes_no": 0.2}
#: Default share of passages that are (generic) distractors; the rest describe one entity each.
DISTRACTOR_SHARE = 0.3
#: Most ``distractor_share`` can be (some passages must describe entities).
MAX_DISTRACTOR_SHARE = 0.9
#: ``namesakes_per_entity`` of the ``--hard`` preset.
HARD_NAMESAKES_PER_ENTITY = 3
#: Most namesake passages per asked entity.
MAX_NAMESAKES_PER_ENTITY = 6
#: Share of entity passages per kind (sums to 1).
KIND_MIX = {"country": 0.05, "city": 0.15, "person": 0.40, "company": 0.15, "film": 0.25}
MIN_PASSAGES = 60
#: Fewest entity passages (what ``MIN_PASSAGES`` leaves at the default distractor share), so
#: every kind of entity exists.
MIN_ENTITY_PASSAGES = MIN_PASSAGES - round(MIN_PASSAGES * DISTRACTOR_SHARE)


class DemoWorldError(ValueError):
    """Invalid demo-world arguments (raised before anything is written)."""


@dataclass(frozen=True)
class DemoWorldConfig:
    """Sizes and seed of a demo world. Defaults: the size the demo and the README use."""

    n_passages: int = 2000
    n_train: int = 2000
    n_dev: int = 200
    n_test: int = 200
    seed: int = 42
    #: Share of ``n_passages`` that are generic distractors (module docstring).
    distractor_share: float = DISTRACTOR_SHARE
    #: Namesake passages added per entity a question asks about, on top of ``n_passages``
    #: (0: none, the default world; ``--hard``: :data:`HARD_NAMESAKES_PER_ENTITY`).
    namesakes_per_entity: int = 0

    def validate(self) -> None:
        for name in ("n_passages", "n_train", "n_dev", "n_test"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise DemoWorldError(f"{name} must be a non-negative integer, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise DemoWorldError(f"seed must be an integer, got {self.seed!r}")
        if self.n_passages < MIN_PASSAGES:
            raise DemoWorldError(
                f"n_passages must be at least {MIN_PASSAGES} so every kind of entity exists, "
                f"got {self.n_passages}"
            )
        if self.n_train + self.n_dev + self.n_test == 0:
            raise DemoWorldError("ask for at least one question (n_train + n_dev + n_test > 0)")
        share = self.distractor_share
        if not isinstance(share, int | float) or isinstance(share, bool) \
                or not 0 <= share <= MAX_DISTRACTOR_SHARE:
            raise DemoWorldError(f"distractor_share must be a number from 0 to "
                                 f"{MAX_DISTRACTOR_SHARE}, got {share!r}")
        entity_passages = self.n_passages - round(self.n_passages * share)
        if entity_passages < MIN_ENTITY_PASSAGES:
            raise DemoWorldError(
                f"distractor_share={share} leaves {entity_passages} of the {self.n_passages} "
                f"passages to entities, but at least {MIN_ENTITY_PASSAGES} are needed so every "
                f"kind of entity exists; lower distractor_share or raise n_passages")
        n = self.namesakes_per_entity
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_NAMESAKES_PER_ENTITY:
            raise DemoWorldError(f"namesakes_per_entity must be an integer from 0 to "
                                 f"{MAX_NAMESAKES_PER_ENTITY}, got {n!r}")

    def split_sizes(self) -> dict[str, int]:
        return {"train": self.n_train, "dev": self.n_dev, "test": self.n_test}

    def to_json(self) -> dict[str, Any]:
        """The configuration as ``world.json`` records it: the opt-in options
        (``distractor_share``, ``namesakes_per_entity``) only when they differ from their
        defaults, so the default world's ``world.json`` stays byte for byte what it was before
        they existed."""
        out = asdict(self)
        for name in _OPT_IN_FIELDS:
            if out[name] == getattr(DemoWorldConfig, name):
                del out[name]
        return out


#: Options added after the demo's figures were published; :meth:`DemoWorldConfig.to_json`
#: writes them only when set.
_OPT_IN_FIELDS = ("distractor_share", "namesakes_per_entity")


@dataclass
class DemoWorld:
    """The generated world: a corpus and question splits in the project's unified schema."""

    config: DemoWorldConfig
    corpus: list[dict[str, str]]
    splits: dict[str, list[dict[str, Any]]]
    stats: dict[str, Any] = field(default_factory=dict)
    #: Hard worlds: the id of every asked entity's passage -> the ids of its namesake passages
    #: (empty without ``namesakes_per_entity``; in memory only, never written).
    namesakes: dict[str, list[str]] = field(default_factory=dict)

    def passage_by_id(self) -> dict[str, dict[str, str]]:
        return {p["id"]: p for p in self.corpus}


# ---------------------------------------------------------------------------------------------
# Entities
# ---------------------------------------------------------------------------------------------


@dataclass
class Country:
    name: str
    language: str
    currency: str
    capital: str = ""
    key: str = ""


@dataclass
class City:
    name: str
    country: str
    founded: int
    population: int
    river: str
    key: str = ""


@dataclass
class Person:
    first: str
    last: str
    born: int
    city: str
    occupation: str
    employer: str = ""
    films: list[str] = field(default_factory=list)
    founded: list[str] = field(default_factory=list)
    key: str = ""

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"


@dataclass
class Company:
    name: str
    short: str
    founded: int
    city: str
    founder: str
    industry: str
    films: list[str] = field(default_factory=list)
    key: str = ""


@dataclass
class Film:
    title: str
    year: int
    director: str
    studio: str
    genre: str
    city: str
    key: str = ""


_ONSETS = [
    "b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "kl", "l", "m", "n", "p", "pr", "r",
    "s", "st", "t", "tr", "v", "z", "th", "sh", "j", "w",
]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "i", "o", "ai", "ei", "ou"]
_CODAS = ["", "", "", "", "n", "r", "l", "s", "m", "nd", "rk"]
#: Words a generated name must not be (answers such as "no" or "yes" must stay unambiguous).
_ENGLISH_WORDS = {
    "yes", "none", "note", "more", "mine", "time", "name", "same", "some", "home", "done",
    "gone", "bone", "tone", "fire", "hire", "wire", "sure", "pure", "lure", "rare", "care",
    "dare", "fare", "bare", "mare", "ware", "here", "were", "there", "where", "tire",
}
_COUNTRY_ENDINGS = ["ia", "land", "ova", "ania", "eth", "istan", "ora", "avia"]
_CITY_ENDINGS = ["ton", "burg", "vale", "mouth", "field", "port", "haven", "ford", "grad", "wick"]
_LANGUAGES_SUFFIX = ["ish", "ese", "ic", "ian"]
_CURRENCIES = ["crown", "mark", "florin", "dinar", "taler", "shilling", "real", "peso", "ducat"]
_RIVERS = ["Amber", "Silver", "Grey", "Swift", "Cold", "Black", "Willow", "Stone", "Iron", "Reed"]
_OCCUPATIONS = [
    "painter", "novelist", "architect", "chemist", "composer", "engineer", "photographer",
    "economist", "sculptor", "physician", "journalist", "astronomer",
]
_INDUSTRIES = ["software", "shipping", "textiles", "railways", "pharmaceuticals", "brewing"]
_COMPANY_SUFFIX = {
    "software": ["Systems", "Labs", "Digital"],
    "shipping": ["Lines", "Maritime", "Freight"],
    "textiles": ["Mills", "Weavers", "Textiles"],
    "railways": ["Rail", "Railways", "Transit"],
    "pharmaceuticals": ["Pharma", "Biologics", "Remedies"],
    "brewing": ["Breweries", "Brewing", "Ales"],
    "film": ["Pictures", "Studios", "Films"],
}
_GENRES = ["drama", "comedy", "thriller", "western", "musical", "science fiction", "horror"]
_TITLE_ADJ = [
    "Amber", "Silent", "Crimson", "Hollow", "Northern", "Broken", "Golden", "Hidden", "Last",
    "Burning", "Frozen", "Distant", "Quiet", "Wandering", "Forgotten", "Velvet", "Paper",
    "Glass", "Iron", "Midnight", "Restless", "Scarlet", "Bitter", "Lonely",
]
_TITLE_NOUN = [
    "Lantern", "Harbor", "Orchard", "Mirror", "Garden", "Road", "Season", "Tide", "Crown",
    "Letter", "Bridge", "Winter", "Tower", "River", "Promise", "Compass", "Voyage", "Station",
    "Feather", "Anthem", "Kingdom", "Summer", "Horizon", "Echo",
]


class _Names:
    """Draws unique pronounceable names; uniqueness is global across all kinds of entity."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def _stem(self, syllables: int) -> str:
        parts = [
            self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
            for _ in range(syllables)
        ]
        return "".join(parts).capitalize()

    def unique(self, make: Callable[[], str]) -> str:
        for _ in range(10_000):
            name = make()
            if name not in self.used and len(name) > 2:
                self.used.add(name)
                return name
        raise RuntimeError("name space exhausted")  # pragma: no cover - astronomically unlikely

    def first_name(self) -> str:
        """A first name that cannot be read as an English word ("No", "Bo", "Tim" ...)."""
        while True:
            name = self._stem(self.rng.randint(1, 2))
            if len(name) >= 4 and name.lower() not in _ENGLISH_WORDS:
                return name

    def word(self, syllables: tuple[int, int] = (2, 2), ending: Sequence[str] = ("",)) -> str:
        return self.unique(
            lambda: self._stem(self.rng.randint(*syllables)) + self.rng.choice(list(ending))
        )


# ---------------------------------------------------------------------------------------------
# World construction
# ---------------------------------------------------------------------------------------------


def fresh_names(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct names like a world's people, cities, countries and films, drawn afresh
    from ``rng`` rather than taken from a world.

    For copy drills a model cannot have memorised: only reading the earlier occurrence predicts
    the repeated name (a world's own titles recur across drills, and a model learns to complete
    them from memory instead). They use the world's syllables, endings and title words, but in
    freer combinations than :class:`_Builder` makes (surnames of 1-3 syllables, cities of 1-2,
    film titles with an invented word): a world's "The <adjective> <noun>" titles come from a
    few hundred combinations and would recur across drills again.
    """
    names = _Names(rng)
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.4:
            out.append(names.unique(
                lambda: f"{names.first_name()} {names._stem(rng.randint(1, 3))}"))
        elif kind < 0.6:
            out.append(names.word((1, 2), _CITY_ENDINGS))
        elif kind < 0.7:
            out.append(names.word((1, 1), _COUNTRY_ENDINGS))
        else:
            out.append(names.unique(
                lambda: f"The {rng.choice(_TITLE_ADJ)} {rng.choice(_TITLE_NOUN)} of "
                f"{names._stem(rng.randint(1, 2))}"
                if rng.random() < 0.5 else f"{rng.choice(_TITLE_ADJ)} {names._stem(2)}"))
    return out


def _kind_counts(n_entity_passages: int) -> dict[str, int]:
    counts = {kind: max(1, int(n_entity_passages * share)) for kind, share in KIND_MIX.items()}
    counts["person"] += n_entity_passages - sum(counts.values())
    counts["country"] = max(counts["country"], 3)
    counts["city"] = max(counts["city"], 2 * counts["country"])
    return counts


class _Builder:
    """Creates the entities and their passages for one configuration."""

    def __init__(self, config: DemoWorldConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.names = _Names(self.rng)
        n_distractors = round(config.n_passages * config.distractor_share)
        self.n_distractors = n_distractors
        counts = _kind_counts(config.n_passages - n_distractors)
        self.countries: list[Country] = []
        self.cities: list[City] = []
        self.people: list[Person] = []
        self.companies: list[Company] = []
        self.films: list[Film] = []
        self._make_entities(counts)

    def entities_by_kind(self) -> dict[str, list[Any]]:
        """Every entity of the world, by kind (``country``, ``city``, ``person``, ``company``,
        ``film``)."""
        return {"country": self.countries, "city": self.cities, "person": self.people,
                "company": self.companies, "film": self.films}

    # -- entities ----------------------------------------------------------------------------

    def _make_entities(self, counts: dict[str, int]) -> None:
        rng = self.rng
        for _ in range(counts["country"]):
            name = self.names.word((1, 1), _COUNTRY_ENDINGS)
            language = name.rstrip("aeiouy") + rng.choice(_LANGUAGES_SUFFIX)
            self.countries.append(Country(name, language, rng.choice(_CURRENCIES)))
        for i in range(counts["city"]):
            country = self.countries[i % len(self.countries)] if i < 2 * len(
                self.countries
            ) else rng.choice(self.countries)
            self.cities.append(
                City(
                    name=self.names.word((1, 1), _CITY_ENDINGS),
                    country=country.name,
                    founded=rng.randint(900, 1850),
                    population=rng.randrange(20_000, 3_000_000, 1_000),
                    river=rng.choice(_RIVERS),
                )
            )
        for country in self.countries:
            own = [c for c in self.cities if c.country == country.name]
            country.capital = rng.choice(own).name
        # Directors are people too; a quarter of the people direct the films.
        n_people = counts["person"]
        n_directors = max(1, min(n_people // 4, (counts["film"] + 1) // 2))
        surnames: list[str] = []
        for i in range(n_people):
            # Some surnames repeat on purpose: namesakes make retrieval harder.
            if surnames and rng.random() < 0.15:
                last = rng.choice(surnames)
            else:
                last = self.names.word((2, 2))
                surnames.append(last)
            first = self._first_name(last)
            occupation = "film director" if i < n_directors else rng.choice(_OCCUPATIONS)
            self.people.append(
                Person(first, last, rng.randint(1901, 1990), rng.choice(self.cities).name,
                       occupation)
            )
        directors = self.people[:n_directors]
        n_companies = counts["company"]
        n_studios = max(1, n_companies // 3)
        for i in range(n_companies):
            industry = "film" if i < n_studios else rng.choice(_INDUSTRIES)
            short = self.names.word((2, 2))
            founder = rng.choice(self.people[n_directors:] or self.people)
            company = Company(
                name=f"{short} {rng.choice(_COMPANY_SUFFIX[industry])}",
                short=short,
                founded=rng.randint(1850, 2010),
                city=rng.choice(self.cities).name,
                founder=founder.name,
                industry=industry,
            )
            founder.founded.append(company.name)
            self.companies.append(company)
        studios = self.companies[:n_studios]
        non_directors = self.people[n_directors:]
        for person in non_directors:
            if rng.random() < 0.5:
                person.employer = rng.choice(self.companies).name
        titles: set[str] = set()
        for i in range(counts["film"]):
            title = self._film_title(titles)
            director = directors[i % len(directors)] if i < 2 * len(directors) else rng.choice(
                directors
            )
            studio = rng.choice(studios)
            film = Film(
                title=title,
                year=rng.randint(max(1930, director.born + 20), min(2023, director.born + 75)),
                director=director.name,
                studio=studio.name,
                genre=rng.choice(_GENRES),
                city=rng.choice(self.cities).name,
            )
            director.films.append(title)
            studio.films.append(title)
            self.films.append(film)

    def _first_name(self, last: str) -> str:
        for _ in range(100):
            first = self.names.first_name()
            if first != last and f"{first} {last}" not in self.names.used:
                self.names.used.add(f"{first} {last}")
                return first
        raise RuntimeError("first-name space exhausted")  # pragma: no cover

    def _film_title(self, taken: set[str]) -> str:
        for _ in range(10_000):
            adjective, noun = self.rng.choice(_TITLE_ADJ), self.rng.choice(_TITLE_NOUN)
            pattern = self.rng.random()
            if pattern < 0.55:
                title = f"The {adjective} {noun}"
            elif pattern < 0.8:
                title = f"{adjective} {noun}"
            else:
                title = f"The {noun} of {self.rng.choice(self.cities).name}"
            if title not in taken:
                taken.add(title)
                return title
        raise DemoWorldError("too many films for the title space; ask for fewer passages")

    # -- passages ----------------------------------------------------------------------------

    def entity_passages(self) -> list[tuple[str, str, str]]:
        """Returns ``(key, title, text)`` for every entity; the key links questions to passages."""
        rng = self.rng
        out: list[tuple[str, str, str]] = []
        for c in self.countries:
            c.key = f"country:{c.name}"
            text = rng.choice([
                f"{c.name} is a country whose capital is {c.capital}. Its official language is "
                f"{c.language} and its currency is the {c.currency}.",
                f"The capital of {c.name} is {c.capital}. People in {c.name} speak {c.language} "
                f"and pay in the {c.currency}.",
                f"{c.name}, officially the Republic of {c.name}, has {c.capital} as its capital. "
                f"The {c.currency} is its currency; {c.language} is spoken there.",
            ])
            out.append((c.key, c.name, text))
        for city in self.cities:
            city.key = f"city:{city.name}"
            pop = f"{city.population:,}"
            text = rng.choice([
                f"{city.name} is a city in {city.country} on the {city.river} River. It was "
                f"founded in {city.founded} and has a population of {pop}.",
                f"Founded in {city.founded}, {city.name} lies on the {city.river} River in "
                f"{city.country}. About {pop} people live there.",
                f"{city.name} ({city.country}) has {pop} inhabitants. The city was founded in "
                f"{city.founded} beside the {city.river} River.",
            ])
            out.append((city.key, city.name, text))
        for p in self.people:
            p.key = f"person:{p.name}"
            article = _article(p.occupation)
            sentences = [rng.choice([
                f"{p.name} (born {p.born} in {p.city}) is {article} {p.occupation}.",
                f"{p.name} is {article} {p.occupation} who was born in {p.city} in {p.born}.",
                f"Born in {p.city} in {p.born}, {p.name} became a well-known {p.occupation}.",
            ])]
            if p.films:
                listed = _join(p.films[:3])
                sentences.append(rng.choice([
                    f"{p.first} directed {listed}.",
                    f"{p.last} is best known as the director of {listed}.",
                ]))
            if p.founded:
                sentences.append(f"{p.last} founded {_join(p.founded)}.")
            if p.employer:
                sentences.append(f"{p.first} has worked for {p.employer}.")
            out.append((p.key, p.name, " ".join(sentences)))
        for co in self.companies:
            co.key = f"company:{co.name}"
            kind = "film studio" if co.industry == "film" else f"{co.industry} company"
            sentences = [rng.choice([
                f"{co.name} is a {kind} founded in {co.founded} by {co.founder}. It is "
                f"headquartered in {co.city}.",
                f"Headquartered in {co.city}, {co.name} is a {kind} that {co.founder} founded in "
                f"{co.founded}.",
                f"{co.founder} founded {co.name} in {co.founded}; the {kind} is based in "
                f"{co.city}.",
            ])]
            if co.films:
                sentences.append(f"Its productions include {_join(co.films[:3])}.")
            out.append((co.key, co.name, " ".join(sentences)))
        for f in self.films:
            f.key = f"film:{f.title}"
            text = rng.choice([
                f"{f.title} is a {f.year} {f.genre} film directed by {f.director}. It was "
                f"produced by {f.studio} and shot in {f.city}.",
                f"Directed by {f.director}, {f.title} is a {f.genre} film released in {f.year}. "
                f"{f.studio} produced it, and it was filmed in {f.city}.",
                f"{f.title} ({f.year}) is a {f.genre} film by {f.director}, made by {f.studio} "
                f"on location in {f.city}.",
            ])
            out.append((f.key, f.title, text))
        return out

    def distractor_passages(self) -> list[tuple[str, str, str]]:
        """Passages that share names and words with real ones but answer no question."""
        rng = self.rng
        out: list[tuple[str, str, str]] = []
        makers = [self._novel, self._festival, self._exhibition, self._namesake]
        titles = {p.name for p in self.people} | {f.title for f in self.films}
        titles |= {c.name for c in self.cities} | {c.name for c in self.countries}
        titles |= {c.name for c in self.companies}
        for i in range(self.n_distractors):
            # 50 tries of the planned kind, then the others: a high distractor_share runs out of
            # distinct novels (one per film) first. The default world never gets past the 50
            # (it used to stop there with an error), so its draws are unchanged.
            for attempt in range(200):
                title, text = makers[(i + max(0, attempt - 49)) % len(makers)]()
                if title not in titles:
                    titles.add(title)
                    out.append((f"distractor:{i}", title, text))
                    break
            else:  # pragma: no cover - would need an absurdly small world
                raise DemoWorldError("could not make enough distinct distractor passages; "
                                     "lower distractor_share")
        rng.shuffle(out)
        return out

    def _novel(self) -> tuple[str, str]:
        f, author = self.rng.choice(self.films), self.rng.choice(self.people)
        year = self.rng.randint(1900, 2023)
        return f"{f.title} (novel)", (
            f"{f.title} is a {year} novel by {author.name}. It is unrelated to the film of the "
            f"same name, although both are set near {self.rng.choice(self.cities).name}."
        )

    def _festival(self) -> tuple[str, str]:
        city = self.rng.choice(self.cities)
        film = self.rng.choice(self.films)
        guest = self.rng.choice(self.people)
        year = self.rng.choice([film.year, film.year + 1, self.rng.randint(1950, 2023)])
        return f"{year} {city.name} Film Festival", (
            f"The {year} {city.name} Film Festival screened {film.title} and invited {guest.name} "
            f"as a guest of honour. Visitors came from {self.rng.choice(self.countries).name}."
        )

    def _exhibition(self) -> tuple[str, str]:
        company = self.rng.choice(self.companies)
        person = self.rng.choice(self.people)
        city = self.rng.choice(self.cities)
        year = self.rng.choice([company.founded, person.born, self.rng.randint(1900, 2023)])
        return f"{company.short} Exhibition of {year}", (
            f"In {year} {company.name} held an exhibition in {city.name}. The {person.occupation} "
            f"{person.name} gave the opening speech, and the event moved to "
            f"{self.rng.choice(self.cities).name} the following year."
        )

    def _namesake(self) -> tuple[str, str]:
        person = self.rng.choice(self.people)
        first = self.names.first_name()
        city = self.rng.choice(self.cities)
        born = self.rng.randint(1850, 1995)
        occupation = self.rng.choice(_OCCUPATIONS)
        return f"{first} {person.last}", (
            f"{first} {person.last} (born {born} in {city.name}) is {_article(occupation)} "
            f"{occupation}. "
            f"{first} is not related to {person.name}, despite the shared family name."
        )


class _Namesakes:
    """Namesake passages of the asked entities (the hard world; module docstring).

    Drawn from ``random.Random`` of its own, so the default world's draws are untouched. Every
    passage's title contains its entity's *name key* (a person's surname, a film's title, a
    company's short name, a city's or country's name) and is new to the corpus. Variant 0 of
    each kind is another, similarly named entity with other facts and can be repeated; variants
    1 and 2 are made once per entity (a family, a play, a foundation, a university, ...).
    Random people, places and years in a namesake never equal the entity's asked facts or its
    bridge neighbours.
    """

    _CITY_PREFIXES = ("New", "North", "South", "Old", "Upper", "Lower", "East", "West", "Port")
    _COUNTRY_PREFIXES = ("Upper", "Lower", "Greater", "East", "West", "New", "North", "South")

    def __init__(self, builder: _Builder, titles: set[str], seed: int) -> None:
        self.b = builder
        self.rng = random.Random(seed * 104_729 + 2)
        self.names = _Names(self.rng)
        self.names.used = set(builder.names.used) | titles
        self.titles = titles
        self.person = {p.name: p for p in builder.people}
        self.company = {c.name: c for c in builder.companies}
        self.makers: dict[str, list[Callable[[Any], tuple[str, str]]]] = {
            "person": [self._person_namesake, self._person_family, self._person_relative],
            "film": [self._film_namesake, self._film_play, self._film_series],
            "company": [self._company_namesake, self._company_foundation, self._company_tower],
            "city": [self._city_namesake, self._city_university, self._city_station],
            "country": [self._country_namesake, self._country_languages, self._country_history],
        }

    def passages(self, entity: Any, count: int) -> list[tuple[str, str]]:
        """``count`` namesake ``(title, text)`` pairs of ``entity``, titles new to the corpus."""
        kind = entity.key.split(":", 1)[0]
        makers = self.makers[kind]
        out = []
        for j in range(count):
            planned = makers[j] if j < len(makers) else makers[0]
            # a once-per-entity title can be taken (two people of one surname): fall back to
            # variant 0, which draws a new name every time
            for attempt in range(60):
                title, text = (planned if attempt < 10 else makers[0])(entity)
                if title not in self.titles:
                    self.titles.add(title)
                    out.append((title, text))
                    break
            else:  # pragma: no cover - would need an absurdly small world
                raise DemoWorldError(f"could not make namesake passages of {entity.key}")
        return out

    # -- helpers -----------------------------------------------------------------------------

    def _year(self, low: int, high: int, *avoid: int) -> int:
        while True:
            year = self.rng.randint(low, high)
            if year not in avoid:
                return year

    def _near(self, year: int, *avoid: int) -> int:
        """A year within 8 of ``year``, never ``year`` itself nor ``avoid``."""
        return self._year(year - 8, year + 8, year, *avoid)

    def _other(self, items: Sequence[Any], avoid: Callable[[Any], bool]) -> Any:
        choices = [item for item in items if not avoid(item)]
        return self.rng.choice(choices or list(items))

    def _similar_first(self, first: str, last: str) -> str:
        """A first name one vowel away from ``first`` (else a fresh one), unused with ``last``."""
        lower = first.lower()
        vowels = [i for i, ch in enumerate(lower) if ch in "aeiou"]
        for attempt in range(40):
            if vowels and attempt < 20:
                i = self.rng.choice(vowels)
                vowel = self.rng.choice([v for v in "aeiou" if v != lower[i]])
                name = (lower[:i] + vowel + lower[i + 1:]).capitalize()
            else:
                name = self.names.first_name()
            full = f"{name} {last}"
            if len(name) >= 4 and name.lower() not in _ENGLISH_WORDS and name != last \
                    and full not in self.names.used:
                self.names.used.add(full)
                return name
        raise DemoWorldError(f"no similar first name for {first} {last}")  # pragma: no cover

    def _stranger(self, *avoid_people: str) -> Person:
        """A person whose surname is none of ``avoid_people``' surnames."""
        lasts = {name.split()[-1] for name in avoid_people}
        return self._other(self.b.people, lambda p: p.last in lasts)

    # -- people: surname, occupation; never the birthplace (a bridge) ------------------------

    def _person_namesake(self, p: Person) -> tuple[str, str]:
        first = self._similar_first(p.first, p.last)
        city = self._other(self.b.cities, lambda c: c.name == p.city)
        born = self._near(p.born)
        return f"{first} {p.last}", (
            f"{first} {p.last} (born {born} in {city.name}) is {_article(p.occupation)} "
            f"{p.occupation}. {first} is often confused with {p.name}, another "
            f"{p.occupation} of the same family name."
        )

    def _person_family(self, p: Person) -> tuple[str, str]:
        first = self._similar_first(p.first, p.last)
        city = self._other(self.b.cities, lambda c: c.name == p.city)
        title = f"The {p.last} family"
        if title in self.titles:
            title = f"The {p.last} family of {city.name}"
        return title, (
            f"The {p.last} family settled in {city.name} in {self._near(p.born) - 60}. Its "
            f"archive, opened in {self._near(p.born)}, keeps the letters of the "
            f"{p.occupation} {first} {p.last}."
        )

    def _person_relative(self, p: Person) -> tuple[str, str]:
        first = self._similar_first(p.first, p.last)
        city = self._other(self.b.cities, lambda c: c.name == p.city)
        occupation = self.rng.choice([o for o in _OCCUPATIONS if o != p.occupation])
        return f"{first} {p.last}", (
            f"Born in {city.name} in {self._near(p.born)}, {first} {p.last} became "
            f"{_article(occupation)} {occupation}."
        )

    # -- films: title, city; never the director or the studio (bridges) ----------------------

    def _film_avoid(self, f: Film) -> tuple[list[str], list[int]]:
        studio = self.company[f.studio]
        director = self.person[f.director]
        return [f.director, studio.founder], [f.year, director.born, studio.founded]

    def _film_namesake(self, f: Film) -> tuple[str, str]:
        people, years = self._film_avoid(f)
        year = self._year(1930, 2023, *years)
        director = self._stranger(*people)
        studio = self._other([c for c in self.b.companies if c.industry == "film"],
                             lambda c: c.name == f.studio)
        genre = self.rng.choice([g for g in _GENRES if g != f.genre])
        return f"{f.title} ({year} film)", (
            f"{f.title} is a {year} {genre} film directed by {director.name} and produced by "
            f"{studio.name}. It shares its title with an unrelated film."
        )

    def _film_play(self, f: Film) -> tuple[str, str]:
        people, years = self._film_avoid(f)
        writer = self._stranger(*people)
        return f"{f.title} (play)", (
            f"{f.title} is a stage play by {writer.name}, first performed in {f.city} in "
            f"{self._year(1900, 2023, *years)}."
        )

    def _film_series(self, f: Film) -> tuple[str, str]:
        people, years = self._film_avoid(f)
        creator = self._stranger(*people)
        start = self._year(1950, 2015, *years)
        end = self._year(start + 1, start + 8, *years)
        return f"{f.title} (TV series)", (
            f"{f.title} is a television {self.rng.choice(_GENRES)} created by {creator.name}. "
            f"It ran from {start} to {end}."
        )

    # -- companies: short name, industry; never the headquarters (a bridge) ------------------

    def _company_namesake(self, co: Company) -> tuple[str, str]:
        industry = self.rng.choice([i for i in _INDUSTRIES if i != co.industry])
        suffix = self.rng.choice([s for s in _COMPANY_SUFFIX[industry]
                                  if f"{co.short} {s}" != co.name])
        founder = self._stranger(co.founder)
        city = self._other(self.b.cities, lambda c: c.name in (co.city, founder.city))
        return f"{co.short} {suffix}", (
            f"{co.short} {suffix} is a {industry} company founded in {self._near(co.founded)} by "
            f"{founder.name}. It is headquartered in {city.name}."
        )

    def _company_foundation(self, co: Company) -> tuple[str, str]:
        city = self._other(self.b.cities, lambda c: c.name == co.city)
        return f"{co.short} Foundation", (
            f"The {co.short} Foundation is a charity based in {city.name}. It was set up in "
            f"{self._near(co.founded)} and funds scholarships in {co.industry}."
        )

    def _company_tower(self, co: Company) -> tuple[str, str]:
        city = self._other(self.b.cities, lambda c: c.name == co.city)
        return f"{co.short} Tower", (
            f"{co.short} Tower is an office building in {city.name}, completed in "
            f"{self._near(co.founded)}. It has {self.rng.randint(12, 60)} floors."
        )

    # -- cities: name, river; never the country ----------------------------------------------

    def _city_namesake(self, c: City) -> tuple[str, str]:
        country = self._other(self.b.countries, lambda k: k.name == c.country)
        name = f"{self.rng.choice(self._CITY_PREFIXES)} {c.name}"
        population = self.rng.randrange(2_000, 90_000, 100)
        return name, (
            f"{name} is a town in {country.name} on the "
            f"{self.rng.choice([r for r in _RIVERS if r != c.river])} River. It was founded in "
            f"{self._near(c.founded)} and has a population of {population:,}."
        )

    def _city_university(self, c: City) -> tuple[str, str]:
        return f"University of {c.name}", (
            f"The University of {c.name} was founded in {self._near(c.founded)} beside the "
            f"{c.river} River. About {self.rng.randrange(3_000, 40_000, 100):,} students study "
            f"there."
        )

    def _city_station(self, c: City) -> tuple[str, str]:
        a, b = self.rng.sample([x for x in self.b.cities if x.name != c.name], 2)
        return f"{c.name} Central Station", (
            f"{c.name} Central Station opened in {self._year(1840, 1990, c.founded)}. Trains "
            f"run from there to {a.name} and {b.name}."
        )

    # -- countries: name; never the capital --------------------------------------------------

    def _country_namesake(self, k: Country) -> tuple[str, str]:
        name = f"{self.rng.choice(self._COUNTRY_PREFIXES)} {k.name}"
        capital = self._other(self.b.cities, lambda c: c.name == k.capital)
        currency = self.rng.choice([c for c in _CURRENCIES if c != k.currency])
        return name, (
            f"{name} is a country whose capital is {capital.name}. Its currency is the "
            f"{currency}."
        )

    def _country_languages(self, k: Country) -> tuple[str, str]:
        return f"Languages of {k.name}", (
            f"Besides {k.language}, {self.rng.randint(2, 9)} regional languages are spoken in "
            f"{k.name}; the oldest written records date from {self.rng.randint(800, 1500)}."
        )

    def _country_history(self, k: Country) -> tuple[str, str]:
        seat = self._other(self.b.cities, lambda c: c.name == k.capital)
        return f"History of {k.name}", (
            f"The recorded history of {k.name} begins in {self.rng.randint(600, 1400)}, when "
            f"its kings ruled from {seat.name}."
        )


def _article(noun: str) -> str:
    return "an" if noun[0] in "aeiou" else "a"


def _join(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


# ---------------------------------------------------------------------------------------------
# Questions
# ---------------------------------------------------------------------------------------------


@dataclass
class _Question:
    question: str
    answers: list[str]
    keys: list[str]  # entity keys of the supporting passages
    decomposition: list[str]
    type: str
    template: str = ""  # which yes/no question template made it (balanced per template)
    #: bridge questions: the last hop as asked by someone who has read the first hop's passage
    #: (its answer, the bridge entity, named); what a multi-turn agent searches for
    resolved_last_hop: str | None = None


class _QuestionMaker:
    """Generates every question the world can make for a pool of subject entities."""

    def __init__(self, builder: _Builder, rng: random.Random) -> None:
        self.b = builder
        self.rng = rng
        self.person = {p.name: p for p in builder.people}
        self.city = {c.name: c for c in builder.cities}
        self.country = {c.name: c for c in builder.countries}
        self.company = {c.name: c for c in builder.companies}

    def _pick(self, *phrasings: str) -> str:
        return self.rng.choice(phrasings)

    def one_hop(self, pool: dict[str, list[Any]]) -> list[_Question]:
        out: list[_Question] = []
        for p in pool["person"]:
            out.append(_Question(
                self._pick(f"In which city was {p.name} born?", f"Where was {p.name} born?"),
                [p.city], [p.key], [f"Where was {p.name} born?"], "one_hop"))
            out.append(_Question(
                self._pick(f"In what year was {p.name} born?", f"When was {p.name} born?"),
                [str(p.born)], [p.key], [f"When was {p.name} born?"], "one_hop"))
        for f in pool["film"]:
            out.append(_Question(
                self._pick(f"Who directed {f.title}?", f"Who is the director of {f.title}?"),
                [f.director, self.person[f.director].last], [f.key],
                [f"Who directed {f.title}?"], "one_hop"))
            out.append(_Question(
                self._pick(f"In which year was {f.title} released?",
                           f"When was the film {f.title} released?"),
                [str(f.year)], [f.key], [f"When was {f.title} released?"], "one_hop"))
        for co in pool["company"]:
            out.append(_Question(
                self._pick(f"When was {co.name} founded?", f"In what year was {co.name} founded?"),
                [str(co.founded)], [co.key], [f"When was {co.name} founded?"], "one_hop"))
            out.append(_Question(
                self._pick(f"Where is {co.name} headquartered?",
                           f"In which city is {co.name} based?"),
                [co.city], [co.key], [f"Where is {co.name} headquartered?"], "one_hop"))
        for city in pool["city"]:
            out.append(_Question(
                self._pick(f"In which country is {city.name}?",
                           f"{city.name} is a city in which country?"),
                self._country_aliases(city.country), [city.key],
                [f"Which country is {city.name} in?"], "one_hop"))
        for c in pool["country"]:
            out.append(_Question(
                self._pick(f"What is the capital of {c.name}?",
                           f"Which city is the capital of {c.name}?"),
                [c.capital], [c.key], [f"What is the capital of {c.name}?"], "one_hop"))
        return out

    def bridge(self, pool: dict[str, list[Any]]) -> list[_Question]:
        out: list[_Question] = []
        for f in pool["film"]:
            d = self.person[f.director]
            out.append(_Question(
                self._pick(f"In which city was the director of {f.title} born?",
                           f"Where was the director of {f.title} born?"),
                [d.city], [f.key, d.key],
                [f"Who directed {f.title}?", f"Where was the director of {f.title} born?"],
                "bridge", resolved_last_hop=f"Where was {d.name} born?"))
            out.append(_Question(
                self._pick(f"In what year was the director of {f.title} born?",
                           f"When was the person who directed {f.title} born?"),
                [str(d.born)], [f.key, d.key],
                [f"Who directed {f.title}?", f"When was the director of {f.title} born?"],
                "bridge", resolved_last_hop=f"When was {d.name} born?"))
            studio = self.company[f.studio]
            out.append(_Question(
                self._pick(f"Who founded the studio that produced {f.title}?",
                           f"The company that made {f.title} was founded by whom?"),
                [studio.founder, self.person[studio.founder].last], [f.key, studio.key],
                [f"Which studio produced {f.title}?", f"Who founded the studio of {f.title}?"],
                "bridge", resolved_last_hop=f"Who founded {studio.name}?"))
        for p in pool["person"]:
            city = self.city[p.city]
            out.append(_Question(
                self._pick(f"In which country was {p.name} born?",
                           f"{p.name} was born in which country?"),
                self._country_aliases(city.country), [p.key, city.key],
                [f"Where was {p.name} born?", f"Which country is the birthplace of {p.name} in?"],
                "bridge", resolved_last_hop=f"Which country is {city.name} in?"))
        for co in pool["company"]:
            city = self.city[co.city]
            out.append(_Question(
                self._pick(f"In which country is {co.name} headquartered?",
                           f"{co.name} has its headquarters in which country?"),
                self._country_aliases(city.country), [co.key, city.key],
                [f"Where is {co.name} headquartered?",
                 f"Which country is the headquarters city of {co.name} in?"],
                "bridge", resolved_last_hop=f"Which country is {city.name} in?"))
        return out

    def comparison(self, pool: dict[str, list[Any]], limit: int) -> list[_Question]:
        specs = [
            ("film", lambda f: f.year, "Which film was released first, {a} or {b}?",
             "When was {x} released?", lambda f: f.title, lambda f: [f.title]),
            ("person", lambda p: p.born, "Who was born first, {a} or {b}?",
             "When was {x} born?", lambda p: p.name, lambda p: [p.name]),
            ("company", lambda c: c.founded, "Which company was founded earlier, {a} or {b}?",
             "When was {x} founded?", lambda c: c.name, lambda c: [c.name, c.short]),
            ("city", lambda c: -c.population, "Which city has more inhabitants, {a} or {b}?",
             "What is the population of {x}?", lambda c: c.name, lambda c: [c.name]),
        ]
        out: list[_Question] = []
        for kind, value, template, sub, name, aliases in specs:
            for a, b in self._pairs(pool[kind], limit):
                if value(a) == value(b):
                    continue
                winner = a if value(a) < value(b) else b
                out.append(_Question(
                    template.format(a=name(a), b=name(b)), aliases(winner), [a.key, b.key],
                    [sub.format(x=name(a)), sub.format(x=name(b))], "comparison"))
        return out

    def yes_no(self, pool: dict[str, list[Any]], limit: int) -> list[_Question]:
        """Same-X questions over pairs (same-group pairs are added on purpose, or 'yes' would be
        rare) and "Did D direct F?" asked once truthfully and once about another director."""
        out: list[_Question] = []
        for a, b in self._pairs_with_matches(pool["person"], lambda p: p.city, limit):
            out.append(_Question(
                f"Were {a.name} and {b.name} born in the same city?",
                ["yes" if a.city == b.city else "no"],
                [a.key, b.key], [f"Where was {a.name} born?", f"Where was {b.name} born?"],
                "yes_no", "same_city"))
        for a, b in self._pairs_with_matches(pool["city"], lambda c: c.country, limit):
            out.append(_Question(
                f"Are {a.name} and {b.name} in the same country?",
                ["yes" if a.country == b.country else "no"], [a.key, b.key],
                [f"Which country is {a.name} in?", f"Which country is {b.name} in?"], "yes_no",
                "same_country"))
        for a, b in self._pairs_with_matches(pool["film"], lambda f: f.director, limit):
            out.append(_Question(
                f"Were {a.title} and {b.title} directed by the same person?",
                ["yes" if a.director == b.director else "no"], [a.key, b.key],
                [f"Who directed {a.title}?", f"Who directed {b.title}?"], "yes_no",
                "same_director"))
        directors = [p for p in self.b.people if p.films]
        for f in pool["film"]:
            others = [p for p in directors if p.name != f.director]
            candidates = [(self.person[f.director], "yes")]
            if others:
                candidates.append((self.rng.choice(others), "no"))
            for candidate, answer in candidates:
                out.append(_Question(
                    f"Did {candidate.name} direct {f.title}?", [answer], [f.key],
                    [f"Who directed {f.title}?"], "yes_no", "did_direct"))
        return out

    def _pairs_with_matches(
        self, items: list[Any], group: Callable[[Any], str], limit: int
    ) -> list[tuple[Any, Any]]:
        """Every pair that shares ``group`` plus up to ``limit`` random pairs."""
        by_group: dict[str, list[Any]] = {}
        for item in items:
            by_group.setdefault(group(item), []).append(item)
        matches = [
            (members[i], members[j])
            for members in by_group.values()
            for i in range(len(members))
            for j in range(i + 1, len(members))
        ]
        return matches + self._pairs(items, limit)

    def _pairs(self, items: list[Any], limit: int) -> list[tuple[Any, Any]]:
        """Up to ``limit`` distinct unordered pairs, drawn at random without replacement."""
        n = len(items)
        total = n * (n - 1) // 2
        if total == 0:
            return []
        if total <= limit:
            pairs = [(items[i], items[j]) for i in range(n) for j in range(i + 1, n)]
            self.rng.shuffle(pairs)
            return pairs
        chosen: set[tuple[int, int]] = set()
        while len(chosen) < limit:
            i, j = sorted(self.rng.sample(range(n), 2))
            chosen.add((i, j))
        return [(items[i], items[j]) for i, j in sorted(chosen)]

    def _country_aliases(self, name: str) -> list[str]:
        return [name, f"Republic of {name}"]


def _balance_yes_no(questions: list[_Question], rng: random.Random) -> list[_Question]:
    """Yes/no pairs: equal numbers of yes and no answers within every question template.

    Balancing all yes/no questions together is not enough: random pairs are mostly "no" and "Did
    D direct F?" is asked truthfully for every film, so a model would answer "no" to same-X
    questions and "yes" to "Did ...?" from the wording alone, without reading. The list is a
    shuffled sequence of (yes, no) pairs of one template each, so any even-length prefix of it is
    balanced too.
    """
    by_template: dict[str, dict[str, list[_Question]]] = {}
    for q in questions:
        by_template.setdefault(q.template, {"yes": [], "no": []})[q.answers[0]].append(q)
    pairs: list[tuple[_Question, _Question]] = []
    for template in sorted(by_template):
        yes, no = by_template[template]["yes"], by_template[template]["no"]
        rng.shuffle(yes)
        rng.shuffle(no)
        pairs.extend(zip(yes, no, strict=False))  # the surplus of one answer is left out
    rng.shuffle(pairs)
    return [q for pair in pairs for q in pair]


def _split_pools(builder: _Builder, sizes: dict[str, int],
                 rng: random.Random) -> dict[str, dict[str, list[Any]]]:
    """Partitions every kind of entity among the splits in proportion to their question counts."""
    total = sum(sizes.values())
    pools: dict[str, dict[str, list[Any]]] = {s: {} for s in SPLITS}
    for kind, items in builder.entities_by_kind().items():
        shuffled = list(items)
        rng.shuffle(shuffled)
        start = 0
        for i, split in enumerate(SPLITS):
            if i == len(SPLITS) - 1:
                end = len(shuffled)
            else:
                end = start + round(len(shuffled) * sizes[split] / total)
                if sizes[split] > 0:
                    end = max(end, start + 1)
            pools[split][kind] = shuffled[start:end]
            start = end
    return pools


def _type_targets(n: int) -> dict[str, int]:
    targets = {t: int(n * share) for t, share in TYPE_MIX.items()}
    remainder = n - sum(targets.values())
    for t in QUESTION_TYPES[:remainder]:
        targets[t] += 1
    return targets


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def generate_demo_world(config: DemoWorldConfig | None = None) -> DemoWorld:
    """Builds the corpus and the question splits in memory (nothing is written).

    Raises :class:`DemoWorldError` for invalid sizes, including asking for more questions of a
    split than its pool of entities can make.
    """
    config = config or DemoWorldConfig()
    config.validate()
    builder = _Builder(config)
    # The questions draw only from q_rng and the corpus only from builder.rng, so making the
    # questions before the corpus is shuffled changes neither (the namesakes need them).
    passages = builder.entity_passages() + builder.distractor_passages()
    sizes = config.split_sizes()
    q_rng = random.Random(config.seed * 7919 + 1)
    pools = _split_pools(builder, sizes, q_rng)
    maker = _QuestionMaker(builder, q_rng)
    chosen_by_split: dict[str, list[_Question]] = {}
    capacity: dict[str, dict[str, int]] = {}
    seen_questions: set[str] = set()
    for split in SPLITS:
        n = sizes[split]
        targets = _type_targets(n)
        pair_limit = max(4 * n, 50)
        candidates = {
            "one_hop": maker.one_hop(pools[split]),
            "bridge": maker.bridge(pools[split]),
            "comparison": maker.comparison(pools[split], pair_limit),
            "yes_no": _balance_yes_no(maker.yes_no(pools[split], pair_limit), q_rng),
        }
        capacity[split] = {}
        chosen: list[_Question] = []
        for qtype in QUESTION_TYPES:
            unique = _dedupe(candidates[qtype], seen_questions)
            capacity[split][qtype] = len(unique)
            if targets[qtype] > len(unique):
                raise DemoWorldError(
                    f"a world of {config.n_passages} passages can make at most {len(unique)} "
                    f"{qtype} questions for the {split} split, but {targets[qtype]} are needed "
                    f"for n_{split}={n}; ask for fewer questions or more passages"
                )
            if qtype != "yes_no":  # yes/no come in balanced pairs already shuffled
                q_rng.shuffle(unique)
            picked = unique[: targets[qtype]]
            seen_questions.update(q.question for q in picked)
            chosen.extend(picked)
        q_rng.shuffle(chosen)
        chosen_by_split[split] = chosen

    asked = list(dict.fromkeys(k for split in SPLITS for q in chosen_by_split[split]
                               for k in q.keys))
    namesake_keys: dict[str, list[str]] = {}
    if config.namesakes_per_entity:
        entities = {e.key: e for items in builder.entities_by_kind().values() for e in items}
        namesakes = _Namesakes(builder, {title for _, title, _ in passages}, config.seed)
        for key in asked:
            made = namesakes.passages(entities[key], config.namesakes_per_entity)
            namesake_keys[key] = [f"namesake:{key}:{j}" for j in range(len(made))]
            passages.extend((nk, title, text)
                            for nk, (title, text) in zip(namesake_keys[key], made, strict=True))
    builder.rng.shuffle(passages)
    width = max(5, len(str(len(passages))))
    corpus = [
        {"id": f"p{i:0{width}d}", "title": title, "text": text}
        for i, (_, title, text) in enumerate(passages)
    ]
    key_to_id = {key: corpus[i]["id"] for i, (key, _, _) in enumerate(passages)}

    splits: dict[str, list[dict[str, Any]]] = {}
    for split in SPLITS:
        splits[split] = [
            {
                "id": f"{split}-{i:05d}",
                "question": q.question,
                "answers": list(dict.fromkeys(q.answers)),
                "supporting_ids": [key_to_id[k] for k in q.keys],
                "decomposition": q.decomposition,
                **({"resolved_decomposition": [*q.decomposition[:-1], q.resolved_last_hop]}
                   if q.resolved_last_hop else {}),
                "type": q.type,
            }
            for i, q in enumerate(chosen_by_split[split])
        ]
    stats: dict[str, Any] = {
        "passages": len(corpus),
        "distractor_passages": builder.n_distractors,
        # hard worlds only (the default world.json keeps its keys)
        **({"namesake_passages": sum(len(v) for v in namesake_keys.values()),
            "asked_entities": len(asked)} if config.namesakes_per_entity else {}),
        "entities": {kind: len(items) for kind, items in builder.entities_by_kind().items()},
        "questions": {s: len(v) for s, v in splits.items()},
        "question_types": {
            s: {t: sum(q["type"] == t for q in v) for t in QUESTION_TYPES}
            for s, v in splits.items()
        },
        "capacity": capacity,
    }
    namesake_ids = {key_to_id[key]: [key_to_id[nk] for nk in keys]
                    for key, keys in namesake_keys.items()}
    return DemoWorld(config=config, corpus=corpus, splits=splits, stats=stats,
                     namesakes=namesake_ids)


def _dedupe(questions: list[_Question], seen: set[str]) -> list[_Question]:
    out: dict[str, _Question] = {}
    for q in questions:
        if q.question not in seen and q.question not in out:
            out[q.question] = q
    return list(out.values())


def write_demo_world(world: DemoWorld, out_dir: str | Path) -> dict[str, Path]:
    """Writes ``corpus.jsonl``, one ``<split>.jsonl`` per split and ``world.json`` atomically.

    The folder is replaced as a whole, so readers never see a mix of two worlds.
    """
    out = Path(out_dir)
    with atomic_dir(out) as tmp:
        atomic_write_jsonl(tmp / "corpus.jsonl", world.corpus)
        for split, records in world.splits.items():
            atomic_write_jsonl(tmp / f"{split}.jsonl", records)
        atomic_write_json(tmp / "world.json", {"config": world.config.to_json(), **world.stats})
    files = {"corpus": out / "corpus.jsonl", "world": out / "world.json"}
    files.update({split: out / f"{split}.jsonl" for split in world.splits})
    return files


def build_demo_index(work: str | Path, config: DemoWorldConfig,
                     progress: bool = False) -> tuple[Path, list[str]]:
    """A demo world of ``config`` written to ``work/world`` and its Flat index built in
    ``work/index`` (what the retrieval benches serve); returns the index folder and every
    question of the world, train, dev and test in that order."""
    from mmoa.retrieval.builder import BuildConfig, build_index

    work = Path(work)
    world = generate_demo_world(config)
    write_demo_world(world, work / "world")
    build_index(BuildConfig(corpus=str(work / "world" / "corpus.jsonl"),
                            output=str(work / "index"), progress=progress))
    questions = [record["question"] for split in ("train", "dev", "test")
                 for record in world.splits[split]]
    return work / "index", questions
