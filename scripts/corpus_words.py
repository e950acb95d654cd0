"""Word lists and small grammar helpers shared by make_corpus.py and make_examples.py.

Everything here was written for this project (no outside text), so the corpus and the example
datasets built from it carry the project's own licence. Keep the lists plain: the base model is
tiny and its tokenizer has only 512 tokens, so simple, frequent English words work best.
"""

GIRLS = ["Lily", "Mia", "Anna", "Lucy", "Emma", "Zoe", "Sara", "Ella", "Rosa", "Nina",
         "Amy", "Kate", "Jane", "Ruby", "Grace", "Molly", "Sophie", "Daisy", "Ivy", "Lena"]
BOYS = ["Tom", "Ben", "Sam", "Max", "Jack", "Leo", "Tim", "Noah", "Finn", "Omar",
        "Dan", "Bob", "Jake", "Luke", "Adam", "Hugo", "Owen", "Eric", "Paul", "Ryan"]
NAMES = GIRLS + BOYS

# (animal, sound, what it likes to eat, how it moves)
ANIMALS = [("cat", "meow", "fish", "jumps"), ("dog", "woof", "bones", "runs"),
           ("bird", "tweet", "seeds", "flies"), ("frog", "ribbit", "bugs", "hops"),
           ("duck", "quack", "bread", "swims"), ("cow", "moo", "grass", "walks"),
           ("pig", "oink", "apples", "rolls"), ("sheep", "baa", "grass", "walks"),
           ("owl", "hoot", "mice", "flies"), ("horse", "neigh", "hay", "runs"),
           ("bear", "growl", "honey", "walks"), ("mouse", "squeak", "cheese", "runs"),
           ("lion", "roar", "meat", "runs"), ("bee", "buzz", "nectar", "flies"),
           ("fox", "yip", "berries", "runs"), ("bunny", "thump", "carrots", "hops")]
ANIMAL_NAMES = [a[0] for a in ANIMALS]

OBJECTS = ["ball", "kite", "hat", "box", "book", "cup", "car", "doll", "boat", "drum",
           "bag", "shell", "stone", "key", "bike", "balloon", "blanket", "sock", "spoon", "bell",
           "train", "robot", "crayon", "coat", "basket", "ring", "flag", "map", "lamp", "toy"]
COLORS = ["red", "blue", "green", "yellow", "pink", "purple", "orange", "white", "black", "brown"]
SIZES = ["big", "little", "small", "tiny", "huge", "tall", "round", "soft", "shiny", "old"]

# place phrases, with the preposition that goes before them
PLACES = [("in", "the park"), ("in", "the garden"), ("in", "the forest"), ("at", "the beach"),
          ("on", "the farm"), ("in", "the house"), ("at", "school"), ("by", "the lake"),
          ("on", "the hill"), ("at", "the shop"), ("at", "the zoo"), ("by", "the river"),
          ("in", "the kitchen"), ("in", "the yard"), ("at", "the library"), ("in", "the town"),
          ("in", "the woods"), ("at", "the pond"), ("in", "the meadow"), ("at", "the market")]

FEELINGS = ["happy", "sad", "scared", "excited", "tired", "angry", "proud", "surprised",
            "hungry", "sleepy", "brave", "shy", "calm", "curious", "glad", "worried"]
GOOD_FEELINGS = ["happy", "excited", "proud", "glad", "calm"]

FOODS = ["apples", "cake", "cookies", "bread", "soup", "pie", "carrots", "grapes", "rice",
         "pancakes", "cheese", "berries", "milk", "candy", "eggs", "pears"]
GAMES = ["tag", "hide and seek", "catch", "ball", "with blocks", "in the sand", "in the snow",
         "with the dog", "on the swings", "in the water"]
WEATHER = ["sunny", "rainy", "windy", "cold", "warm", "snowy", "cloudy", "hot"]
TIMES = ["One day", "One morning", "One sunny day", "Last summer", "One evening",
         "Yesterday", "One cold night", "Once", "On Monday", "One rainy day"]


def article(word):
    """'a' or 'an' for the word that follows."""
    return "an" if word[0].lower() in "aeiou" else "a"


def with_article(phrase):
    return f"{article(phrase)} {phrase}"


def pronoun(name):
    return "she" if name in GIRLS else "he"


def possessive(name):
    return "her" if name in GIRLS else "his"


def object_pronoun(name):
    return "her" if name in GIRLS else "him"


def cap(s):
    return s[0].upper() + s[1:]


def plural(noun):
    if noun == "mouse":
        return "mice"
    if noun == "sheep":
        return "sheep"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    if noun.endswith("x") or noun.endswith("s") or noun.endswith("sh"):
        return noun + "es"
    return noun + "s"


def owner_form(name):
    """Tom -> Tom's, Ross -> Ross's (plain English possessive)."""
    return name + "'s"


# ---------------------------------------------------------------------------------------------
# Reading-comprehension questions: a short context of facts about different people, one question
# about one fact. The base corpus answers with a full sentence; the quickstart examples teach a
# short fixed format instead (examples/README.md), which is what fine-tuning visibly changes.

def make_fact(rng, name, kind, used_objects):
    """Returns (context sentence, [(question, full answer, short answer), ...]) for one fact."""
    if kind == "has":
        obj = rng.choice([o for o in OBJECTS if o not in used_objects])
        used_objects.add(obj)
        color = rng.choice(COLORS)
        thing = f"{color} {obj}"
        return (f"{name} has {with_article(thing)}.",
                [(f"What does {name} have?", f"{name} has {with_article(thing)}.", with_article(thing)),
                 (f"What color is {owner_form(name)} {obj}?", f"{owner_form(name)} {obj} is {color}.", color),
                 (f"Who has the {thing}?", f"{name} has the {thing}.", name)])
    if kind == "where":
        prep, place = rng.choice(PLACES)
        return (f"{name} is {prep} {place}.",
                [(f"Where is {name}?", f"{name} is {prep} {place}.", f"{prep} {place}")])
    if kind == "feel":
        feeling = rng.choice(FEELINGS)
        return (f"{name} is {feeling}.",
                [(f"How does {name} feel?", f"{name} feels {feeling}.", feeling)])
    if kind == "likes":
        food = rng.choice(FOODS)
        return (f"{name} likes {food}.",
                [(f"What does {name} like to eat?", f"{name} likes to eat {food}.", food)])
    animal = rng.choice(ANIMAL_NAMES)
    return (f"{name} has a pet {animal}.",
            [(f"What pet does {name} have?", f"{name} has a pet {animal}.", with_article(animal))])


FACT_KINDS = ["has", "has", "where", "feel", "likes", "pet"]


def make_reading_question(rng, n_facts=None):
    """(context, question, full answer, short answer, all (q, full, short) of the context)."""
    n = n_facts or rng.randint(2, 4)
    names = rng.sample(NAMES, n)
    used = set()
    sentences, qas = [], []
    for name in names:
        sentence, q = make_fact(rng, name, rng.choice(FACT_KINDS), used)
        sentences.append(sentence)
        qas.extend(q)
    question, full, short = rng.choice(qas)
    return " ".join(sentences), question, full, short, qas
