"""A seedable synthetic world of fictional entities: documents to search and questions only search answers.

`build_world(seed, size)` is a pure function of its arguments (numpy `default_rng(seed)`, no set iteration,
no hashing of strings): the same seed gives the same world on every machine. Entities and their facts:

    Country  area (km²), capital → City
    City     founded (year), population, in → Country
    Person   born (year), occupation, born in → City
    Landmark (bridge/lighthouse/tower) opened (year), height or length (m), in → City, designed by → Person
    Company  founded (year), employees, founded by → Person, headquarters → City

Every entity has one document "Title\\nsentences" stating its facts and relations; about one in four cities
and persons also has a near-twin distractor (a name one letter away, other numbers). Questions ask a fact
of one entity (1 hop) or follow relations (2-3 hops: "In which country was the designer of X born?"); each
carries its `chain` of entity names, and searching those names in order reaches the answer (the oracle
used by the tests). Names come from a syllable table, so no model knows the answers. Shapes follow the
corpus of the multi-agent spec (spec/multi-agent.md §4), simplified.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

SIZES = {
    "tiny": dict(countries=4, cities=12, people=24, landmarks=12, companies=8),
    "small": dict(countries=12, cities=60, people=150, landmarks=80, companies=50),
    "lookup": dict(people=600, cities=16),  # `build_lookup_world`: closed-set answers, one question a person
    "rooms": dict(people=600),  # `build_room_world`: a one-letter answer at the end of a one-line document
    # the rooms world made for copying names (configs/ssp_tiny.yaml): three-letter names, and a sentence in
    # which "room of " precedes the name as in the question, so the question's name continues a text the
    # search result already shows
    "rooms_copy": dict(people=600, letters=3, sentence="The room of {name} is {room}.",
                       avoid=("but", "for", "not")),  # the search's English stopwords of that shape
    "fields": dict(people=800, fields=12),  # `build_field_world`: 12 fields a person, the fields env
    "fields4": dict(people=800, fields=4),  # the same with 4 fields (configs/agentic_rl_tiny.yaml)
}
_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "qu", "r", "s", "st",
           "t", "th", "tr", "v", "w", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ia", "ou")
_CODAS = ("", "n", "r", "l", "s", "th", "nd", "rk", "m", "x")
_FIRST = ("Ilse", "Oren", "Maelis", "Tobin", "Sabra", "Edric", "Lunet", "Corvin", "Anwen", "Iskra", "Dorian",
          "Yselle", "Bastien", "Marit", "Quill", "Rhoswen", "Teodor", "Vela", "Ansel", "Orla")
_OCCUPATIONS = ("architect", "weaver", "cartographer", "engineer", "botanist", "composer", "glassmaker",
                "astronomer")
_COUNTRY_SUFFIX = ("Vale", "Reach", "March", "Isles", "Commons")
_LANDMARK_KIND = {"Bridge": "long", "Lighthouse": "tall", "Tower": "tall"}
_COMPANY_SUFFIX = ("Looms", "Works", "Foundry", "Mills", "Shipwrights")
_BLOCKLIST = ("Paris", "London", "Berlin", "Rome", "Tokyo", "Darwin", "Newton", "Lincoln")
_LOOKUP_JOBS = _OCCUPATIONS + ("baker", "sailor", "potter", "miller", "tailor", "mason", "drover", "fletcher")
_LOOKUP_COLOURS = ("red", "blue", "green", "amber", "violet", "grey", "white", "black", "teal", "olive",
                   "coral", "ivory", "indigo", "scarlet", "ochre", "silver")
# 16 one-character room codes that occur nowhere else in an episode (names start with one of "bdfgklmnprstvz"
# upper-cased; "Doc 1"; never "A", an article to answer normalisation), so the code is the one token of its
# kind in the search result: with codes shared with name initials the tiny model learned to copy only "C", "H"
_ROOMS = tuple("23456789CEHJOUXY")
# the fields of `build_field_world`: four-letter words with distinct first letters (lower case: no code)
FIELD_NAMES = ("room", "desk", "gate", "lane", "hall", "pier", "bank", "cell", "ward", "fort", "shed", "tier",
               "nook", "mill", "yard", "kiln")
_LOOKUP_QUESTIONS = {"job": "What is the job of {}?", "city": "What is the home city of {}?",
                     "colour": "What is the favourite colour of {}?"}


@dataclasses.dataclass(frozen=True)
class World:
    """Documents (`contents` = "Title\\ntext", ids d000000…) and questions with exact answers."""

    seed: int
    size: str
    docs: tuple[dict[str, str], ...]
    questions: tuple[dict[str, Any], ...]
    entities: dict[str, dict[str, Any]]

    @property
    def contents(self) -> tuple[str, ...]:
        return tuple(d["contents"] for d in self.docs)

    def records(self, split: str) -> list[dict[str, Any]]:
        """Questions of a split: every fifth question (by index) is "eval", the rest "train"."""
        if split not in ("train", "eval"):
            raise ValueError(f"split={split!r}: allowed values are 'train', 'eval'")
        return [q for q in self.questions if (q["index"] % 5 == 4) == (split == "eval")]


class _Names:
    def __init__(self, rng: np.random.Generator):
        self.rng, self.used = rng, set()

    def short(self, letters: int = 5, avoid: tuple[str, ...] = ()) -> str:
        """A name of `letters` letters, consonants and vowels alternating from a consonant (CVCVC for five;
        fixed length: easy to copy), never one of `avoid` (lower case)."""
        while True:
            c, v = "bdfgklmnprstvz", "aeiou"
            w = "".join(self.rng.choice(list(c if i % 2 == 0 else v)) for i in range(letters)).capitalize()
            if w not in self.used and w.lower() not in avoid:
                self.used.add(w)
                return w

    def word(self, syllables: int) -> str:
        while True:
            parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(syllables)]
            w = ("".join(parts) + self.rng.choice(_CODAS)).capitalize()
            if w not in self.used and w not in _BLOCKLIST and len(w) >= 4:
                self.used.add(w)
                return w


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


def _num(n: int) -> str:
    return f"{n:,}"


def build_world(seed: int = 0, size: str = "tiny") -> World:
    """The world for (seed, size); `size` is a key of `SIZES`. Builds in milliseconds for "tiny"."""
    if size not in SIZES:
        raise ValueError(f"size={size!r}: allowed values are {', '.join(map(repr, SIZES))}")
    if size == "lookup":
        return build_lookup_world(seed, **SIZES[size])
    if size in ("rooms", "rooms_copy"):
        return build_room_world(seed, **SIZES[size], size=size)
    if size in ("fields", "fields4"):
        return build_field_world(seed, **SIZES[size], size=size)
    n = SIZES[size]
    rng = np.random.default_rng(int(seed))
    names = _Names(rng)
    ent: dict[str, dict[str, Any]] = {}
    countries = [f"{names.word(2)} {_pick(rng, _COUNTRY_SUFFIX)}" for _ in range(n["countries"])]
    cities = [names.word(2) for _ in range(n["cities"])]
    people = [f"{_pick(rng, _FIRST)} {names.word(2)}" for _ in range(n["people"])]
    landmarks = [f"{names.word(2)} {_pick(rng, tuple(_LANDMARK_KIND))}" for _ in range(n["landmarks"])]
    companies = [f"{names.word(2)} {_pick(rng, _COMPANY_SUFFIX)}" for _ in range(n["companies"])]
    for i, c in enumerate(cities):  # every country gets at least one city; the first is its capital
        ent[c] = dict(type="city", country=countries[i % len(countries)],
                      founded=int(rng.integers(900, 1900)), population=int(rng.integers(10, 2000)) * 1000)
    for i, c in enumerate(countries):
        ent[c] = dict(type="country", capital=cities[i], area=int(rng.integers(2_000, 400_000)))
    for p in people:
        ent[p] = dict(type="person", born=int(rng.integers(1850, 1991)), city=_pick(rng, cities),
                      occupation=_pick(rng, _OCCUPATIONS))
    for lm in landmarks:
        ent[lm] = dict(type="landmark", kind=lm.split()[-1], city=_pick(rng, cities),
                       designer=_pick(rng, people), opened=int(rng.integers(1800, 2021)),
                       metres=int(rng.integers(20, 900)))
    for co in companies:
        ent[co] = dict(type="company", founder=_pick(rng, people), hq=_pick(rng, cities),
                       founded=int(rng.integers(1850, 2021)), employees=int(rng.integers(5, 9000)) * 10)
    texts = [_document(name, e) for name, e in ent.items()]
    twins = [name for name in cities + people if rng.random() < 0.25]
    for name in twins:
        texts.append(_document(_twin(name, names, rng), _perturbed(ent[name], rng)))
    docs = tuple({"id": f"d{i:06d}", "contents": t} for i, t in enumerate(texts))
    questions = tuple(dict(q, index=i, id=f"q{seed}-{i:05d}") for i, q in enumerate(_questions(ent)))
    return World(int(seed), size, docs, questions, ent)


def build_lookup_world(seed: int = 0, people: int = 600, cities: int = 16) -> World:
    """A one-hop world whose answers come from small closed sets (`size="lookup"` of `build_world`).

    Each person (a five-letter name) has a job (16 values), a home city (`cities` names) and a favourite
    colour (16 values), drawn uniformly; its one document reads "Name is a job from City. Favourite colour:
    colour." and its one question asks one attribute, drawn uniformly, with the name last ("What is the job
    of Name?"). A held-out question is about a person no training question names, and every value of its
    answer appears in many training answers: a model must search to know WHICH value, but never has to
    spell a value it has not seen. Guessing without searching scores about 1/16 (`tests/agent`).
    """
    rng = np.random.default_rng([int(seed), 17])
    names = _Names(rng)
    towns = [names.word(2) for _ in range(int(cities))]
    values = {"job": _LOOKUP_JOBS, "city": tuple(towns), "colour": _LOOKUP_COLOURS}
    ent: dict[str, dict[str, Any]] = {}
    questions = []
    for i in range(int(people)):
        name = names.short()
        e = dict(type="person", **{k: _pick(rng, v) for k, v in values.items()})
        ent[name] = e
        key = _pick(rng, tuple(_LOOKUP_QUESTIONS))
        q = dict(_q(_LOOKUP_QUESTIONS[key].format(name), e[key], [name]), attribute=key)
        questions.append(dict(q, index=i, id=f"l{seed}-{i:05d}"))
    texts = [f"{name}\n{name} is {_article(e['job'])} {e['job']} from {e['city']}. Favourite colour: "
             f"{e['colour']}." for name, e in ent.items()]
    docs = tuple({"id": f"d{i:06d}", "contents": t} for i, t in enumerate(texts))
    return World(int(seed), "lookup", docs, tuple(questions), ent)


def build_room_world(seed: int = 0, people: int = 600, *, letters: int = 5,
                     sentence: str = "{name} has room {room}.", avoid: tuple[str, ...] = (),
                     size: str = "rooms") -> World:
    """The easiest world to read an answer from (`size="rooms"` of `build_world`, configs/search_tiny.yaml).

    Each person (a five-letter name) has a room, one of 16 codes (`_ROOMS`) drawn uniformly; its document
    reads "Name\nName has room K." and its one question is "What is the room of Name?". The answer is
    one character at a fixed place (the end of the only line of the search result), so a tiny
    character-level model can learn to copy it; without searching, a guess scores about 1/16.
    `letters` (names of that many letters, none in `avoid`) and `sentence` (the document's line, with {name}
    and {room}) make variants ("rooms_copy"); the defaults are the "rooms" world. `size`: its `SIZES` key.
    """
    rng = np.random.default_rng([int(seed), 23])
    names = _Names(rng)
    ent: dict[str, dict[str, Any]] = {}
    questions = []
    for i in range(int(people)):
        name = names.short(letters, avoid)
        ent[name] = dict(type="person", room=_pick(rng, _ROOMS))
        q = dict(_q(f"What is the room of {name}?", ent[name]["room"], [name]), attribute="room")
        questions.append(dict(q, index=i, id=f"r{seed}-{i:05d}"))
    docs = tuple({"id": f"d{i:06d}", "contents": f"{name}\n" + sentence.format(name=name, room=e["room"])}
                 for i, (name, e) in enumerate(ent.items()))
    return World(int(seed), size, docs, tuple(questions), ent)


def build_field_world(seed: int = 0, people: int = 800, fields: int = 12, size: str = "fields") -> World:
    """People with `fields` attributes each, for the fields environment (`size="fields"` of `build_world`,
    jaxrl.envs.fields, configs/agentic_rl_tiny.yaml).

    Each person (a five-letter name) has the first `fields` of `FIELD_NAMES`, with distinct values drawn
    from the 16 room codes (`_ROOMS`, found nowhere else in an episode); its one question asks one field,
    drawn uniformly ("What is the desk of Nidem?"), and carries it as `field`. A person's document lists
    its fields one a line ("desk: 7"). Values are distinct within a person, so reading another field than
    the asked one is always wrong; guessing a code without reading scores about 1/16. `size`: its `SIZES` key.
    """
    if not 1 <= int(fields) <= len(FIELD_NAMES):
        raise ValueError(f"fields={fields}: must be in [1, {len(FIELD_NAMES)}]")
    rng = np.random.default_rng([int(seed), 29])
    names = _Names(rng)
    keys = FIELD_NAMES[: int(fields)]
    ent: dict[str, dict[str, Any]] = {}
    questions = []
    for i in range(int(people)):
        name = names.short()
        codes = rng.permutation(len(_ROOMS))[: len(keys)]
        ent[name] = dict(type="person", **{k: _ROOMS[int(c)] for k, c in zip(keys, codes)})
        key = _pick(rng, keys)
        q = dict(_q(f"What is the {key} of {name}?", ent[name][key], [name]), field=key)
        questions.append(dict(q, index=i, id=f"f{seed}-{i:05d}"))
    docs = tuple({"id": f"d{i:06d}", "contents": f"{name}\n" + "\n".join(f"{k}: {e[k]}" for k in keys)}
                 for i, (name, e) in enumerate(ent.items()))
    return World(int(seed), size, docs, tuple(questions), ent)


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _document(name: str, e: dict[str, Any]) -> str:
    t = e["type"]
    if t == "country":
        body = (f"{name} is a country with an area of {_num(e['area'])} square kilometres. Its capital is "
                f"{e['capital']}.")
    elif t == "city":
        body = (f"{name} is a city in {e['country']}. It was founded in {e['founded']} and has a population "
                f"of {_num(e['population'])}.")
    elif t == "person":
        job = e["occupation"]
        body = f"{name} was {_article(job)} {job} born in {e['born']} in the city of {e['city']}."
    elif t == "landmark":
        kind = e["kind"].lower()
        body = (f"The {name} is a {kind} in {e['city']}, designed by {e['designer']}. It opened in "
                f"{e['opened']} and is {e['metres']} metres {_LANDMARK_KIND[e['kind']]}.")
    else:
        body = (f"{name} is a company founded in {e['founded']} by {e['founder']}. Its headquarters are in "
                f"{e['hq']} and it employs {_num(e['employees'])} people.")
    return f"{name}\n{body}"


def _twin(name: str, names: _Names, rng: np.random.Generator) -> str:
    """The name with one vowel of its last word changed (unique, never a real entity's name)."""
    head, _, last = name.rpartition(" ")
    for _ in range(50):
        i = int(rng.integers(1, len(last)))
        w = last[:i] + _pick(rng, ("a", "e", "i", "o", "u", "y")) + last[i + 1:]
        if w != last and w not in names.used:
            names.used.add(w)
            return f"{head} {w}".strip()
    return f"{head} {names.word(2)}".strip()


def _perturbed(e: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    out = dict(e)
    for key in ("founded", "population", "born"):
        if key in out:
            out[key] = out[key] + int(rng.integers(1, 40)) * (1000 if key == "population" else 1)
    return out


def _q(question: str, answer: Any, chain: list[str]) -> dict[str, Any]:
    ans = _num(answer) if isinstance(answer, int) and answer >= 10_000 else str(answer)
    return {"question": question, "answers": [ans], "hops": len(chain), "chain": chain}


def _questions(ent: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for name, e in ent.items():
        t = e["type"]
        if t == "country":
            out.append(_q(f"What is the capital of {name}?", e["capital"], [name]))
        elif t == "city":
            out.append(_q(f"In which country is {name}?", e["country"], [name]))
            out.append(_q(f"In which year was {name} founded?", e["founded"], [name]))
        elif t == "person":
            city = ent[e["city"]]
            out.append(_q(f"In which year was {name} born?", e["born"], [name]))
            out.append(_q(f"In which city was {name} born?", e["city"], [name]))
            out.append(_q(f"In which country was {name} born?", city["country"], [name, e["city"]]))
        elif t == "landmark":
            d, city = ent[e["designer"]], ent[e["city"]]
            out.append(_q(f"Who designed the {name}?", e["designer"], [name]))
            out.append(_q(f"In which year was the designer of the {name} born?", d["born"],
                          [name, e["designer"]]))
            out.append(_q(f"What is the population of the city where the {name} stands?", city["population"],
                          [name, e["city"]]))
            out.append(_q(f"In which country was the designer of the {name} born?", ent[d["city"]]["country"],
                          [name, e["designer"], d["city"]]))
        else:
            out.append(_q(f"Who founded {name}?", e["founder"], [name]))
            out.append(_q(f"In which city was the founder of {name} born?", ent[e["founder"]]["city"],
                          [name, e["founder"]]))
    return out


WORLD_FIELDS = ("question", "chain", "answers")


def check_world_records(records, world: World | None, *, who: str, split: str) -> None:
    """Refuses (ConfigError, one line) records a world-reading system cannot use: a record without the fields
    of this module's questions (`WORLD_FIELDS`), or, with `world`, one whose chain names a person the world
    does not have (questions over another world: every one unanswerable)."""
    from jaxrl.errors import ConfigError

    for i, record in enumerate(records):
        missing = [f for f in WORLD_FIELDS if f not in record]
        if missing:
            raise ConfigError(
                f"data: {split} record {i} has fields {sorted(record)}; {who} reads questions over its world "
                f"with fields {', '.join(WORLD_FIELDS)} (as data.source: entities makes them)")
        unknown = [n for n in record["chain"] if world is not None and n not in world.entities]
        if unknown:
            raise ConfigError(
                f"data: {split} record {i} asks about {unknown[0]!r}, who is not in {who}'s world "
                f"(corpus_seed={world.seed}, corpus_size={world.size!r}): give the data and multi_agent.params "
                "the same world")
