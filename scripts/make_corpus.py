#!/usr/bin/python3
"""Generates the text corpus the demo base model (models/tiny-chat) is trained on.

Usage: /usr/bin/python3 scripts/make_corpus.py [--seed 1234] [--rows 60000] [--out FILE]

Python 3 standard library only. The output is a JSONL file of {"text": ...} rows, the same
bytes for the same seed and row count on any Python 3.2+ (random.Random with a fixed seed;
only choice/sample/randint/random are used).

Contents (all written for this project from the templates and word lists in corpus_words.py,
so the corpus carries the project's licence):
  - short children's stories (about 55%): characters, places, objects, feelings, dialogue;
  - chat turns in the ChatML form of the model's chat template (about 45%): reading-
    comprehension questions answered with a full sentence, story requests, facts about animals,
    and a little small talk. A chat row ends after the last assistant message: the trainer adds
    the tokenizer's eos token (<|im_end|>) to every text row, which closes that last turn.
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus_words import (ANIMALS, ANIMAL_NAMES, BOYS, COLORS, FEELINGS, FOODS, GAMES, GIRLS,  # noqa: E402
                          GOOD_FEELINGS, NAMES, OBJECTS, PLACES, SIZES, TIMES, WEATHER, article, cap,
                          make_reading_question, object_pronoun, plural, possessive, pronoun,
                          with_article)

IM_START, IM_END, IM_SEP = "<|im_start|>", "<|im_end|>", "<|im_sep|>"


# ------------------------------------------------------------------------------------ stories
def hero(rng):
    """(name, intro sentence, is_animal, animal tuple or None)."""
    name = rng.choice(NAMES)
    r = rng.random()
    if r < 0.3:
        animal = rng.choice(ANIMALS)
        size = rng.choice(SIZES[:4])
        intro = f"Once upon a time, there was {with_article(size)} {animal[0]} named {name}."
        return name, intro, animal
    kind = "girl" if name in GIRLS else "boy"
    size = rng.choice(["little", "kind", "happy", "small", "brave", "curious"])
    if r < 0.65:
        intro = f"Once upon a time, there was {with_article(size)} {kind} named {name}."
    else:
        intro = f"{name} was {with_article(size)} {kind} who lived near {rng.choice(PLACES)[1]}."
    return name, intro, None


def friend_of(rng, name):
    return rng.choice([n for n in NAMES if n != name])


def story_lost_object(rng):
    name, intro, _ = hero(rng)
    he, his = pronoun(name), possessive(name)
    obj, color = rng.choice(OBJECTS), rng.choice(COLORS)
    prep, place = rng.choice(PLACES)
    friend = friend_of(rng, name)
    s = [intro, f"{cap(he)} had {with_article(color + ' ' + obj)}. {cap(he)} loved {his} {obj} very much."]
    s.append(f"{rng.choice(TIMES)}, {name} took the {obj} to {place}.")
    s.append(rng.choice([f"{cap(he)} played with it all day.", f"The sun was {rng.choice(['warm', 'bright'])} and {name} was {rng.choice(GOOD_FEELINGS)}."]))
    s.append(f"But when it was time to go home, the {obj} was gone! {name} was {rng.choice(['sad', 'worried', 'scared'])}.")
    s.append(f"\"Where is my {obj}?\" {he} cried.")
    s.append(f"{friend} saw {object_pronoun(name)} and said, \"Do not worry. I will help you look.\"")
    hide = rng.choice(["under a tree", "behind a rock", "near the water", "in the tall grass", "under a bench"])
    s.append(f"They looked everywhere. At last, {friend} found the {color} {obj} {hide}.")
    s.append(f"{name} smiled and said, \"Thank you, {friend}! You are a good friend.\"")
    s.append(rng.choice([f"From that day on, {name} and {friend} played together every day.",
                         f"{name} hugged {his} {obj} and went home {rng.choice(GOOD_FEELINGS)}.",
                         f"They walked home together, holding hands."]))
    return " ".join(s)


def story_new_friend(rng):
    name, intro, _ = hero(rng)
    he = pronoun(name)
    animal, sound, eats, moves = rng.choice(ANIMALS)
    prep, place = rng.choice(PLACES)
    game = rng.choice(GAMES)
    s = [intro, f"{rng.choice(TIMES)}, {name} went to {place}."]
    s.append(f"There {he} saw {with_article(rng.choice(SIZES) + ' ' + animal)}. The {animal} said, \"{cap(sound)}, {sound}!\"")
    s.append(rng.choice([f"{name} was {rng.choice(['surprised', 'curious', 'shy'])} at first.",
                         f"{name} wanted to be friends with the {animal}."]))
    s.append(f"\"Hello, {animal}! Do you want to play?\" asked {name}.")
    s.append(f"The {animal} {PAST[moves]} around {name} and they played {game}.")
    s.append(f"Then {name} gave the {animal} some {eats}. The {animal} liked the {eats} very much.")
    s.append(rng.choice([f"When the sun went down, {name} said goodbye. \"I will come back tomorrow,\" {he} said.",
                         f"They became best friends and played {prep} {place} every day.",
                         f"{name} went home and told {possessive(name)} mom about the new friend."]))
    return " ".join(s)


def story_weather(rng):
    name, intro, _ = hero(rng)
    he, his = pronoun(name), possessive(name)
    prep, place = rng.choice(PLACES)
    prep, place = rng.choice(OUTDOOR)
    food = rng.choice(["a cake", "cookies", "bread", "soup", "a pie", "pancakes"])
    weather = rng.choice(["rainy", "cold", "windy", "snowy"])
    parent = rng.choice(["mom", "dad", "grandma", "grandpa"])
    s = [intro, f"{name} wanted to go to {place}, but it was {weather} outside."]
    s.append(f"{name} felt {rng.choice(['sad', 'angry', 'bored'])}. \"I want to play outside,\" {he} said.")
    s.append(f"{cap(his)} {parent} said, \"We can stay inside and make {food} together.\"")
    s.append(f"So {name} and {his} {parent} made {food} in the kitchen. It was fun!")
    s.append(rng.choice([f"The {food.split()[-1]} smelled so good. {name} ate a lot and was very happy.",
                         f"{name} learned that a {weather} day can be a good day too."]))
    s.append(f"The next day it was {rng.choice(['sunny', 'warm'])}, and {name} went to {place} to play.")
    return " ".join(s)


def story_sharing(rng):
    name, intro, _ = hero(rng)
    friend = friend_of(rng, name)
    obj = rng.choice(OBJECTS)
    color = rng.choice(COLORS)
    prep, place = rng.choice(PLACES)
    s = [intro, f"{name} and {friend} were playing {prep} {place}."]
    s.append(f"They found {with_article(color + ' ' + obj)}. Both of them wanted it.")
    s.append(f"\"It is mine!\" said {name}. \"No, it is mine!\" said {friend}.")
    s.append(f"They pulled and pulled. {name} felt {rng.choice(['angry', 'sad'])}, and {friend} started to cry.")
    s.append(f"Then {name} had an idea. \"Let us share the {obj},\" {pronoun(name)} said.")
    s.append(f"{friend} smiled. They took turns with the {obj} and had a lot of fun.")
    s.append(rng.choice(["Sharing made them both happy.", "They learned that sharing is better than fighting.",
                         f"At the end of the day, they were good friends again."]))
    return " ".join(s)


def story_animal(rng):
    animal, sound, eats, moves = rng.choice(ANIMALS)
    name = rng.choice(NAMES)
    size = rng.choice(SIZES[:4])
    he, his = ("she", "her") if name in GIRLS else ("he", "his")
    prep, place = rng.choice(PLACES)
    other, osound, oeats, _ = rng.choice([a for a in ANIMALS if a[0] != animal])
    s = [f"Once upon a time, there was {with_article(size)} {animal} named {name}. {name} lived {prep} {place}."]
    s.append(f"Every day, {name} {PAST[moves]} around and looked for {eats}. {cap(eats)} was {his} favorite food."
             if eats in ("honey", "cheese", "grass", "hay", "bread", "meat", "nectar") else
             f"Every day, {name} {PAST[moves]} around and looked for {eats}. {name} loved {eats}.")
    s.append(f"One day, {name} met {with_article(other)}. \"{cap(osound)}!\" said the {other}. \"I am hungry.\"")
    s.append(f"{name} wanted to help. {cap(he)} found some {oeats} and gave {'it' if oeats in ('honey', 'cheese', 'grass', 'hay', 'bread', 'meat', 'nectar') else 'them'} to the {other}.")
    s.append(f"The {other} was so happy. \"Thank you, {name}!\" it said.")
    s.append(rng.choice([f"From then on, the {animal} and the {other} were best friends.",
                         f"{name} felt {rng.choice(GOOD_FEELINGS)} because {he} helped a friend.",
                         f"They played together until the sun went down."]))
    return " ".join(s)


def story_day_out(rng):
    name, intro, _ = hero(rng)
    he, his = pronoun(name), possessive(name)
    parent = rng.choice(["mom", "dad", "grandma", "grandpa", "big sister", "big brother"])
    places = rng.sample(PLACES, 2)
    weather = rng.choice(WEATHER[:2] + WEATHER[4:5])
    s = [intro, f"It was a {weather} day. {name} and {his} {parent} went to {places[0][1]}."]
    s.append(f"{cap(he)} saw {rng.choice(COLORS)} flowers and {with_article(rng.choice(SIZES))} {rng.choice(ANIMAL_NAMES)}.")
    s.append(f"Then they went to {places[1][1]}. {name} ate some {rng.choice(FOODS)} and played {rng.choice(GAMES)}.")
    s.append(f"\"This is the best day ever!\" said {name}.")
    s.append(f"When they got home, {name} was very {rng.choice(['tired', 'sleepy'])}. {cap(he)} went to bed and dreamed about {places[0][1]}.")
    return " ".join(s)


OUTDOOR = [p for p in PLACES if p[1] not in ("the house", "the kitchen", "school", "the library", "the shop")]
PAST = {"jumps": "jumped", "runs": "ran", "flies": "flew", "hops": "hopped", "swims": "swam",
        "walks": "walked", "rolls": "rolled"}


STORIES = [story_lost_object, story_new_friend, story_weather, story_sharing, story_animal, story_day_out]


# ------------------------------------------------------------------------------------ chats
def turn(role, content, close=True):
    return f"{IM_START}{role}{IM_SEP}{content}" + (IM_END if close else "")


def chat(messages):
    """ChatML text without the last <|im_end|> (the trainer appends eos to text rows)."""
    out = "".join(turn(r, c) for r, c in messages[:-1])
    return out + turn(*messages[-1], close=False)


def chat_reading(rng):
    context, q, full, _, qas = make_reading_question(rng)
    msgs = [("user", f"{context} {q}"), ("assistant", full)]
    others = [x for x in qas if x[0] != q]
    if others and rng.random() < 0.3:
        q2, full2, _ = rng.choice(others)
        msgs += [("user", q2), ("assistant", full2)]
    return chat(msgs)


def chat_story(rng):
    fn = rng.choice(STORIES)
    story = fn(rng)
    ask = rng.choice(["Tell me a story.", "Can you tell me a short story?", "Please tell me a story.",
                      "Tell me a story for kids.", "I want to hear a story."])
    return chat([("user", ask), ("assistant", story)])


def chat_animal_fact(rng):
    animal, sound, eats, moves = rng.choice(ANIMALS)
    a = animal
    qs = [(f"What does {with_article(a)} say?", f"{cap(with_article(a))} says {sound}."),
          (f"What sound does {with_article(a)} make?", f"{cap(with_article(a))} says {sound}."),
          (f"What do {plural(a)} eat?", f"{cap(plural(a))} eat {eats}."),
          (f"How does {with_article(a)} move?", f"{cap(with_article(a))} {moves}.")]
    q, ans = rng.choice(qs)
    return chat([("user", q), ("assistant", ans)])


SMALL_TALK = [
    ("Hello!", "Hello! How can I help you today?"),
    ("Hi!", "Hi! What would you like to talk about?"),
    ("How are you?", "I am happy today. Thank you for asking!"),
    ("What is your name?", "I am a small helper. I like stories and questions."),
    ("Who are you?", "I am a small helper. I can tell stories and answer simple questions."),
    ("What can you do?", "I can tell you a short story or answer a question about a story."),
    ("Thank you!", "You are welcome!"),
    ("Goodbye!", "Goodbye! Have a nice day!"),
    ("What color is the sky?", "The sky is blue."),
    ("What color is grass?", "Grass is green."),
    ("Is the sun hot?", "Yes, the sun is very hot."),
    ("What do you like?", "I like stories about animals and friends."),
]


def chat_small_talk(rng):
    q, a = rng.choice(SMALL_TALK)
    return chat([("user", q), ("assistant", a)])


def make_row(rng):
    r = rng.random()
    if r < 0.55:
        return rng.choice(STORIES)(rng)
    if r < 0.87:
        return chat_reading(rng)
    if r < 0.93:
        return chat_animal_fact(rng)
    if r < 0.97:
        return chat_story(rng)
    return chat_small_talk(rng)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--rows", type=int, default=60000)
    ap.add_argument("--out", default="-")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")
    for _ in range(args.rows):
        out.write(json.dumps({"text": make_row(rng)}) + "\n")
    if out is not sys.stdout:
        out.close()


if __name__ == "__main__":
    main()
