"""Coin stories told the way people tell them, for training (wordings="people"): composed from a
subject, a verb phrase in the present or the past tense, an optional tail, and sentences that have
nothing to do with the coin.

A model trained on the template sentences of `tasks.coinflip` misread the kinds of sentence a person
writes: a flip with a pronoun object and a tail ("... flips it while ..."), anything in the past
tense, a sentence about something else (read as a change), an opening that names the face that is
down or says which face is *not* up, and a passed turn; later, a face named with a direction, a
short "skips", turns decided by dice, gestures beside the coin, and flips with no one named. Each
kind has a pool here; none of these sentences is in the hand-written evaluation set
(`tasks.coinflip_free`), which was written apart.

>>> import random
>>> s, flips = event_sentence(random.Random(1), "Ann", "flip", past=True)
>>> s.endswith(".") and s.count(".") == 1
True
"""

from __future__ import annotations

import random

ROLES = ("my aunt", "the coach", "a girl", "our neighbour", "the cashier", "her cousin", "his boss", "the nurse",
         "a tourist", "the librarian", "my roommate", "the old man")
PRONOUNS = ("she", "he", "I", "we", "they")
# (present, past) verb phrases; "{o}" in none of them: the result is told without naming the face
FLIPS = (
    ("flips it", "flipped it"), ("flips it over", "flipped it over"), ("turns it to the other side",
                                                                       "turned it to the other side"),
    ("gives it a flip", "gave it a flip"), ("flips the penny", "flipped the penny"),
    ("flips it back", "flipped it back"), ("flips it once more", "flipped it once more"),
    ("knocks it onto its other side", "knocked it onto its other side"),
    ("nudges it so the other face is up", "nudged it so the other face was up"),
    ("turns it the other way up", "turned it the other way up"), ("flips it again", "flipped it again"),
    ("flips the coin a single time", "flipped the coin a single time"),
    # told through someone else, or followed by another clause ({m}: another person)
    ("gets {m} to turn it over", "got {m} to turn it over"), ("hands it to {m}, who flips it",
                                                              "handed it to {m}, who flipped it"),
    ("tells {m} to flip it, and {m} obeys", "told {m} to flip it, and {m} obeyed"),
    ("flips it and then goes back to reading", "flipped it and then went back to reading"),
    ("turns it over, then wanders off", "turned it over, then wandered off"),
    ("flips it and says nothing about it", "flipped it and said nothing about it"),
    ("bumps the table so hard that the coin flips", "bumped the table so hard that the coin flipped"),
    ("drops it, and it comes down on its other side", "dropped it, and it came down on its other side"),
    # a flip with the means or the manner told, or another action after it
    ("flips it with the back of a spoon", "flipped it with the back of a spoon"),
    ("flips it with one knuckle", "flipped it with one knuckle"),
    ("turns it over with a pencil tip", "turned it over with a pencil tip"),
    ("flips it, just as {m} taught them", "flipped it, just as {m} had taught them"),
    ("flips it over and closes the curtains", "flipped it over and closed the curtains"),
    ("flips it one more time and puts the kettle on", "flipped it one more time and put the kettle on"),
    # a turn decided by dice or cards: the roll allows the flip
    ("throws the dice, gets a five and flips the coin", "threw the dice, got a five and flipped the coin"),
    ("rolls high, so gets to turn the coin over", "rolled high, so got to turn the coin over"),
    ("draws a red card and flips it", "drew a red card and flipped it"),
)
STAYS = (
    ("passes", "passed"), ("sits out", "sat out"), ("declines to flip it", "declined to flip it"),
    ("only looks at it", "only looked at it"), ("leaves it be", "left it be"),
    ("picks it up and puts it down the same way", "picked it up and put it down the same way"),
    ("polishes it and puts it back as it was", "polished it and put it back as it was"),
    ("talks about the coin", "talked about the coin"), ("points at it", "pointed at it"),
    ("lets the turn go by", "let the turn go by"), ("does not play this round", "did not play that round"),
    ("almost flips it but stops", "almost flipped it but stopped"),
    # moved without being turned over
    ("slides it to the edge of the table", "slid it to the edge of the table"),
    ("pushes the coin along the shelf, same side up", "pushed the coin along the shelf, same side up"),
    ("moves it a little to the left without turning it", "moved it a little to the left without turning it"),
    ("carries it to the window and sets it down as it was", "carried it to the window and set it down as it was"),
    ("drags it closer with one finger", "dragged it closer with one finger"),
    # asked to flip, and does not
    ("asks {m} to flip it, but {m} refuses", "asked {m} to flip it, but {m} refused"),
    ("asks {m} for a flip, and {m} says no", "asked {m} for a flip, and {m} said no"),
    ("tells {m} not to touch it", "told {m} not to touch it"),
    # a turn not taken, said shortly
    ("skips", "skipped"), ("skips a go", "skipped a go"), ("skips this round", "skipped that round"),
    ("misses a turn", "missed a turn"), ("gives up the turn", "gave up the turn"),
    # a turn decided by dice or cards: the roll forbids the flip
    ("throws the dice, gets a one and leaves the coin alone", "threw the dice, got a one and left the coin alone"),
    ("rolls low, so may not touch the coin", "rolled low, so could not touch the coin"),
    ("draws a black card and must pass", "drew a black card and had to pass"),
    # looks at it closely, or acts near it, without turning it
    ("leans over and peers at it", "leaned over and peered at it"),
    ("crouches to look at it from the side", "crouched to look at it from the side"),
    ("says it is a lucky coin", "said it was a lucky coin"),
)
# optional tails of an event sentence (tense-neutral)
TAILS = (" while waiting", " with a grin", " for fun", " during lunch", " without a word", " after a while",
         ", laughing", " when nobody is looking", " to tease her brother", " before bed", " on the way out",
         " as a joke", " just because", " for no reason at all")
# sentences about something else: no change to the coin (present, past)
FILLERS = (
    ("{n} drinks some water.", "{n} drank some water."), ("The phone rings.", "The phone rang."),
    ("A bird lands on the window sill.", "A bird landed on the window sill."),
    ("{n} laughs at a joke.", "{n} laughed at a joke."), ("The lights flicker.", "The lights flickered."),
    ("Somebody knocks at the door.", "Somebody knocked at the door."),
    ("{n} checks the time.", "{n} checked the time."),
    ("It gets dark outside.", "It got dark outside."), ("The kettle whistles.", "The kettle whistled."),
    ("{n} ties a shoelace.", "{n} tied a shoelace."), ("A car honks in the street.", "A car honked in the street."),
    ("{n} reads a message.", "{n} read a message."),
    # a scene that goes on around the coin, with no one named
    ("The waiter brings the bill.", "The waiter brought the bill."),
    ("The music gets louder.", "The music got louder."),
    ("The bus pulls into the station.", "The bus pulled into the station."),
    ("The referee blows the whistle.", "The referee blew the whistle."),
    ("The croupier collects the chips.", "The croupier collected the chips."),
    ("Rain starts to fall on the roof.", "Rain started to fall on the roof."),
    ("The teacher writes a sum on the board.", "The teacher wrote a sum on the board."),
    ("Everyone takes a short break.", "Everyone took a short break."),
    ("A dog barks two streets away.", "A dog barked two streets away."),
    ("The game show host reads the next question.", "The game show host read the next question."),
    # a gesture or a chore beside the coin, by someone named or the narrator
    ("{n} sighs loudly.", "{n} sighed loudly."), ("{n} shrugs.", "{n} shrugged."),
    ("{n} raises an eyebrow.", "{n} raised an eyebrow."), ("The two of them bow.", "The two of them bowed."),
    ("Everybody claps.", "Everybody clapped."), ("{n} irons a shirt.", "{n} ironed a shirt."),
    ("I wash the cups.", "I washed the cups."), ("I sweep the floor.", "I swept the floor."),
    ("{n} says the coin is older than the house.", "{n} said the coin was older than the house."),
    ("{n} hums a song.", "{n} hummed a song."),
)
# flips with no one named: something else turns the coin (present, past)
FLIP_SCENES = (
    ("A gust of wind turns it over.", "A gust of wind turned it over."),
    ("The table shakes and the coin lands on its other side.",
     "The table shook and the coin landed on its other side."),
    ("A jolt of the train knocks it over.", "A jolt of the train knocked it over."),
    ("One more jolt tips it back.", "One more jolt tipped it back."),
    ("The cat paws it onto its other face.", "The cat pawed it onto its other face."),
    ("A thump on the shelf flips it once again.", "A thump on the shelf flipped it once again."),
    ("A knock on the table bounces it over.", "A knock on the table bounced it over."),
    ("Another knock turns it back over.", "Another knock turned it back over."),
    ("A second gust flips it back.", "A second gust flipped it back."),
    ("The washing machine shakes it onto its other side.", "The washing machine shook it onto its other side."),
)
# openings: (present, past), {s} the face up, {o} the other face, {S} the face up capitalised
OPENINGS = (
    ("{S} is up.", "{S} was up."), ("The coin is {o} side down.", "The coin was {o} side down."),
    ("The coin is not showing {o}.", "The coin was not showing {o}."),
    ("The coin rests with {o} against the table.", "The coin rested with {o} against the table."),
    ("{S} shows on the coin.", "{S} showed on the coin."), ("A penny sits {s} up on the shelf.",
                                                            "A penny sat {s} up on the shelf."),
    ("The coin has its {o} side facing down.", "The coin had its {o} side facing down."),
    ("The coin is on {s}, not {o}.", "The coin was on {s}, not {o}."),
    ("The face you can see on the coin is {s}.", "The face you could see on the coin was {s}."),
    ("Its {o} side is hidden against the floor.", "Its {o} side was hidden against the floor."),
    # the coin placed somewhere, told in the past (perfect) tense: the face named is the face up
    ("A coin lies {s} up on the doormat.", "A coin had come to rest {s} up on the doormat."),
    ("The nickel lands {s} up under the sofa.", "The nickel had landed {s} up under the sofa."),
    ("A dime waits on the stairs with {s} up.", "A dime had been waiting on the stairs with {s} up."),
    ("The coin falls out of the jar and ends {s} up.", "The coin had fallen out of the jar and ended {s} up."),
    ("On the dashboard, a coin shows {s}.", "On the dashboard, a coin had been showing {s}."),
    ("A token rests {s} up in the sand.", "A token had rested {s} up in the sand for days."),
    # the face named with a direction or a viewer: up, to the sky, visible; or the face down
    ("The coin turns its {s} face to the sky.", "The coin had its {s} face turned to the sky."),
    ("A coin on the bench has its {s} side in view.", "A coin on the bench had its {s} side in view."),
    ("On the tray, a coin shows its {s} side to the light.", "On the tray, a coin showed its {s} side to the light."),
    ("A quarter, {o} side down, on the sill.", "A quarter, {o} side down, had been left on the sill."),
    ("Coin on the table, {o} side against the wood.", "Coin on the table, {o} side against the wood."),
    # "facing" towards something above: the face named is the face up (balances the face-down openings)
    ("A coin lies with {s} facing upward.", "A coin lay with {s} facing upward."),
    ("The coin sits on the shelf, {s} facing the lamp.", "The coin sat on the shelf, {s} facing the lamp."),
    ("A dime rests on the roof, {s} turned toward the clouds.",
     "A dime rested on the roof, {s} turned toward the clouds."),
    ("A nickel turns up in the drawer, and {s} is facing up.",
     "A nickel turned up in the drawer, and {s} was facing up."),
    ("Someone spots a coin by the door with {s} on top.", "Someone spotted a coin by the door with {s} on top."),
    # negated: the face up is the one not named
    ("The face on top is not {o}.", "The face on top was not {o}."),
    ("Whatever else, the coin is not {o} up.", "Whatever else, the coin was not {o} up."),
)
# heads is the portrait side: openings that name it so (only where the face up is known)
PORTRAIT = {"heads": ("The coin lies portrait side up.", "The coin lay portrait side up."),
            "tails": ("The coin lies portrait side down.", "The coin lay portrait side down.")}
PAST_SHARE = 0.4  # share of composed stories told in the past tense
FILLER_SHARE = 0.3  # share of composed stays that are about something else
TAIL_SHARE = 0.35  # share of composed event sentences with a tail
SCENE_FLIP_SHARE = 0.15  # share of composed flips with no one named (FLIP_SCENES)


def subject(rng: random.Random, name: str, past: bool) -> str:
    """Who acts: the drawn name, a role or a pronoun ("I", "we" and "they" only in the past tense, where
    the verb does not agree with its subject)."""
    r = rng.random()
    pronouns = PRONOUNS if past else PRONOUNS[:2]
    return name if r < 0.5 else rng.choice(ROLES) if r < 0.8 else rng.choice(pronouns)


OTHERS = ("Priya", "Omar", "Lena", "Kofi", "Yuki", "Ines", "Tomas", "Ada")  # the {m} of a phrase


def event_sentence(rng: random.Random, name: str, kind: str, past: bool) -> tuple[str, bool]:
    """One composed event sentence of ``kind`` ("flip" or "stay") and whether it flips the coin."""
    if kind == "stay" and rng.random() < FILLER_SHARE:
        return rng.choice(FILLERS)[past].format(n=name), False
    if kind == "flip" and rng.random() < SCENE_FLIP_SHARE:
        return rng.choice(FLIP_SCENES)[past], True
    who = subject(rng, name, past)
    phrase = rng.choice(FLIPS if kind == "flip" else STAYS)[past].format(m=rng.choice(OTHERS))
    tail = rng.choice(TAILS) if rng.random() < TAIL_SHARE else ""
    return f"{who[0].upper()}{who[1:]} {phrase}{tail}.", kind == "flip"


def opening(rng: random.Random, face: str, other: str, past: bool) -> str:
    """A composed opening that says, directly or not, that ``face`` is up."""
    if rng.random() < 0.1:
        return PORTRAIT[face][past]
    return rng.choice(OPENINGS)[past].format(s=face, o=other, S=face.capitalize())
