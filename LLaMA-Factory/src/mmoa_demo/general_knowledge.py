"""Hand-written general-knowledge questions: the candidates of the decision agent's "known" group.

The demo world's questions are about a synthetic encyclopedia, so only retrieval answers them.
The decision agent also needs questions a pre-trained model answers from what it already knows;
these are facts every small instruct model has seen many times (capitals, chemical symbols,
authors of famous works, planets, common facts). Which of them a given model really knows is
measured, not assumed (:mod:`mmoa_demo.known_split`). Demo-only data, so it lives outside the
installed library.

Each question has a ``category`` so that the rule for the never-measured test part can be
chosen per category on dev. Answers that are common English words are avoided (iodine's "I"
would be "found" in "I do not know").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KnowledgeQuestion:
    id: str
    question: str
    answers: tuple[str, ...]
    category: str


CAPITALS: tuple[tuple[str, str], ...] = (
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Portugal", "Lisbon"), ("the United Kingdom", "London"), ("Ireland", "Dublin"),
    ("Belgium", "Brussels"), ("the Netherlands", "Amsterdam"), ("Austria", "Vienna"),
    ("Switzerland", "Bern"), ("Poland", "Warsaw"), ("the Czech Republic", "Prague"),
    ("Hungary", "Budapest"), ("Greece", "Athens"), ("Sweden", "Stockholm"),
    ("Norway", "Oslo"), ("Denmark", "Copenhagen"), ("Finland", "Helsinki"),
    ("Iceland", "Reykjavik"), ("Russia", "Moscow"), ("Ukraine", "Kyiv"),
    ("Romania", "Bucharest"), ("Bulgaria", "Sofia"), ("Serbia", "Belgrade"),
    ("Croatia", "Zagreb"), ("Turkey", "Ankara"), ("Egypt", "Cairo"), ("Kenya", "Nairobi"),
    ("Nigeria", "Abuja"), ("Ethiopia", "Addis Ababa"), ("Morocco", "Rabat"),
    ("Ghana", "Accra"), ("South Korea", "Seoul"), ("North Korea", "Pyongyang"),
    ("Japan", "Tokyo"), ("China", "Beijing"), ("India", "New Delhi"),
    ("Pakistan", "Islamabad"), ("Bangladesh", "Dhaka"), ("Thailand", "Bangkok"),
    ("Vietnam", "Hanoi"), ("Indonesia", "Jakarta"), ("the Philippines", "Manila"),
    ("Malaysia", "Kuala Lumpur"), ("Iran", "Tehran"), ("Iraq", "Baghdad"),
    ("Saudi Arabia", "Riyadh"), ("Afghanistan", "Kabul"),
    ("Nepal", "Kathmandu"), ("the United States", "Washington, D.C."),
    ("Canada", "Ottawa"), ("Mexico", "Mexico City"), ("Cuba", "Havana"),
    ("Brazil", "Brasilia"), ("Argentina", "Buenos Aires"), ("Chile", "Santiago"),
    ("Peru", "Lima"), ("Colombia", "Bogota"), ("Venezuela", "Caracas"),
    ("Australia", "Canberra"), ("New Zealand", "Wellington"), ("Scotland", "Edinburgh"),
    ("Wales", "Cardiff"), ("Lebanon", "Beirut"), ("Syria", "Damascus"),
    ("Jordan", "Amman"), ("Qatar", "Doha"), ("Singapore", "Singapore"),
)

ELEMENTS: tuple[tuple[str, str], ...] = (
    ("hydrogen", "H"), ("helium", "He"), ("carbon", "C"), ("nitrogen", "N"),
    ("oxygen", "O"), ("sodium", "Na"), ("magnesium", "Mg"), ("aluminium", "Al"),
    ("silicon", "Si"), ("phosphorus", "P"), ("sulfur", "S"), ("chlorine", "Cl"),
    ("potassium", "K"), ("calcium", "Ca"), ("iron", "Fe"), ("copper", "Cu"),
    ("zinc", "Zn"), ("silver", "Ag"), ("tin", "Sn"), ("gold", "Au"), ("mercury", "Hg"),
    ("lead", "Pb"), ("uranium", "U"), ("neon", "Ne"), ("nickel", "Ni"),
    ("platinum", "Pt"), ("fluorine", "F"), ("lithium", "Li"),
    ("argon", "Ar"),
)

WORKS: tuple[tuple[str, str], ...] = (
    ("Romeo and Juliet", "William Shakespeare"), ("Hamlet", "William Shakespeare"),
    ("Macbeth", "William Shakespeare"), ("Pride and Prejudice", "Jane Austen"),
    ("Emma", "Jane Austen"), ("War and Peace", "Leo Tolstoy"),
    ("Anna Karenina", "Leo Tolstoy"), ("Crime and Punishment", "Fyodor Dostoevsky"),
    ("Don Quixote", "Miguel de Cervantes"), ("1984", "George Orwell"),
    ("Animal Farm", "George Orwell"), ("Oliver Twist", "Charles Dickens"),
    ("A Christmas Carol", "Charles Dickens"), ("Great Expectations", "Charles Dickens"),
    ("The Old Man and the Sea", "Ernest Hemingway"), ("Moby-Dick", "Herman Melville"),
    ("Adventures of Huckleberry Finn", "Mark Twain"),
    ("The Adventures of Tom Sawyer", "Mark Twain"), ("Frankenstein", "Mary Shelley"),
    ("Dracula", "Bram Stoker"), ("The Odyssey", "Homer"), ("The Iliad", "Homer"),
    ("Les Miserables", "Victor Hugo"), ("The Divine Comedy", "Dante Alighieri"),
    ("Harry Potter and the Philosopher's Stone", "J. K. Rowling"),
    ("The Hobbit", "J. R. R. Tolkien"), ("The Lord of the Rings", "J. R. R. Tolkien"),
    ("The Great Gatsby", "F. Scott Fitzgerald"), ("Jane Eyre", "Charlotte Bronte"),
    ("Wuthering Heights", "Emily Bronte"), ("The Origin of Species", "Charles Darwin"),
    ("Faust", "Johann Wolfgang von Goethe"), ("The Raven", "Edgar Allan Poe"),
    ("Alice's Adventures in Wonderland", "Lewis Carroll"),
    ("The Communist Manifesto", "Karl Marx"),
)

PAINTINGS: tuple[tuple[str, str], ...] = (
    ("the Mona Lisa", "Leonardo da Vinci"), ("The Last Supper", "Leonardo da Vinci"),
    ("The Starry Night", "Vincent van Gogh"), ("Sunflowers", "Vincent van Gogh"),
    ("Guernica", "Pablo Picasso"), ("The Scream", "Edvard Munch"),
    ("The Persistence of Memory", "Salvador Dali"), ("The Birth of Venus", "Sandro Botticelli"),
    ("Girl with a Pearl Earring", "Johannes Vermeer"), ("The Night Watch", "Rembrandt"),
    ("the ceiling of the Sistine Chapel", "Michelangelo"),
)

#: (country, answers): "On which continent is X?". Countries on two continents, on islands
#: often named by their region (the Caribbean), and Australia (its answer is in the question)
#: are left out; Egypt and Brazil are among the facts.
CONTINENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    *((country, ("Europe",)) for country in (
        "France", "Germany", "Italy", "Spain", "Portugal", "Poland", "Sweden", "Norway",
        "Greece", "Ireland", "Austria", "Hungary", "the Netherlands", "Belgium", "Denmark",
        "Finland", "Switzerland")),
    *((country, ("Asia",)) for country in (
        "Japan", "China", "India", "Thailand", "Vietnam", "South Korea", "Pakistan", "Nepal",
        "Mongolia", "Indonesia", "the Philippines", "Bangladesh", "Iran", "Saudi Arabia",
        "Malaysia")),
    *((country, ("Africa",)) for country in (
        "Kenya", "Nigeria", "Ethiopia", "Ghana", "Morocco", "South Africa", "Senegal",
        "Tanzania", "Uganda", "Algeria", "Zimbabwe", "Angola")),
    *((country, ("North America",)) for country in ("Canada", "the United States", "Mexico")),
    *((country, ("South America",)) for country in (
        "Argentina", "Chile", "Peru", "Colombia", "Venezuela", "Bolivia", "Ecuador", "Uruguay",
        "Paraguay")),
    ("New Zealand", ("Oceania",)), ("Fiji", ("Oceania",)),
)

#: (country, answers): "What language is mainly spoken in X?". Brazil, Mexico and Australia
#: are among the facts; countries with two main languages are left out.
LANGUAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("France", ("French",)), ("Germany", ("German",)), ("Italy", ("Italian",)),
    ("Spain", ("Spanish",)), ("Portugal", ("Portuguese",)), ("Russia", ("Russian",)),
    ("Japan", ("Japanese",)), ("China", ("Chinese", "Mandarin")), ("Greece", ("Greek",)),
    ("the Netherlands", ("Dutch",)), ("Sweden", ("Swedish",)), ("Turkey", ("Turkish",)),
    ("Argentina", ("Spanish",)), ("Egypt", ("Arabic",)), ("Saudi Arabia", ("Arabic",)),
    ("Iran", ("Persian", "Farsi")), ("Israel", ("Hebrew",)), ("Norway", ("Norwegian",)),
    ("Finland", ("Finnish",)), ("Hungary", ("Hungarian",)), ("South Korea", ("Korean",)),
    ("Thailand", ("Thai",)), ("Vietnam", ("Vietnamese",)), ("Indonesia", ("Indonesian",)),
    ("Chile", ("Spanish",)), ("Colombia", ("Spanish",)), ("Peru", ("Spanish",)),
    ("the United States", ("English",)), ("Denmark", ("Danish",)),
    ("the Czech Republic", ("Czech",)),
)

#: Other facts: (question, answers).
FACTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What is the largest planet in the solar system?", ("Jupiter",)),
    ("Which planet is closest to the Sun?", ("Mercury",)),
    ("Which planet is known as the Red Planet?", ("Mars",)),
    ("Which planet has the most famous rings?", ("Saturn",)),
    ("What is the third planet from the Sun?", ("Earth",)),
    ("What is the largest ocean on Earth?", ("Pacific Ocean", "Pacific")),
    ("What is the longest river in Africa?", ("Nile", "the Nile")),
    ("What is the highest mountain in the world?", ("Mount Everest", "Everest")),
    ("What is the largest desert in Africa?", ("Sahara", "the Sahara")),
    ("What is the largest continent?", ("Asia",)),
    ("On which continent is Egypt?", ("Africa",)),
    ("On which continent is Brazil?", ("South America",)),
    ("How many days are there in a week?", ("seven", "7")),
    ("How many continents are there?", ("seven", "7")),
    ("How many legs does a spider have?", ("eight", "8")),
    ("How many sides does a triangle have?", ("three", "3")),
    ("How many hours are there in a day?", ("24", "twenty-four")),
    ("How many minutes are there in an hour?", ("60", "sixty")),
    ("What is the boiling point of water in degrees Celsius?", ("100", "one hundred")),
    ("What is the freezing point of water in degrees Celsius?", ("0", "zero")),
    ("What gas do plants absorb from the air?", ("carbon dioxide", "CO2")),
    ("What gas do humans need to breathe?", ("oxygen",)),
    ("What is the chemical formula of water?", ("H2O",)),
    ("What is the largest mammal?", ("blue whale", "the blue whale")),
    ("What is the fastest land animal?", ("cheetah", "the cheetah")),
    ("What do bees make?", ("honey",)),
    ("What is the opposite of hot?", ("cold",)),
    ("What color is the sky on a clear day?", ("blue",)),
    ("What color do you get by mixing blue and yellow?", ("green",)),
    ("Which organ pumps blood through the body?", ("heart", "the heart")),
    ("Who developed the theory of relativity?", ("Albert Einstein", "Einstein")),
    ("Who was the first president of the United States?", ("George Washington",)),
    ("Who was the first person to walk on the Moon?", ("Neil Armstrong",)),
    ("Who composed the Fifth Symphony that begins with four famous notes?",
     ("Ludwig van Beethoven", "Beethoven")),
    ("Who discovered penicillin?", ("Alexander Fleming",)),
    ("Who invented the telephone?", ("Alexander Graham Bell",)),
    ("In which country are the pyramids of Giza?", ("Egypt",)),
    ("In which city is the Eiffel Tower?", ("Paris",)),
    ("In which city is the Colosseum?", ("Rome",)),
    ("In which country is the Great Wall?", ("China",)),
    ("What language is mainly spoken in Brazil?", ("Portuguese",)),
    ("What language is mainly spoken in Mexico?", ("Spanish",)),
    ("What is the currency of Japan?", ("yen", "Japanese yen")),
    ("What is the currency of the United Kingdom?", ("pound sterling", "pound")),
    ("What is the square root of 81?", ("9", "nine")),
    ("What is 12 times 12?", ("144",)),
    ("How many players are on a soccer team on the field?", ("11", "eleven")),
    ("What is the hardest natural substance?", ("diamond",)),
    ("What is the smallest prime number?", ("2", "two")),
    ("What is the main language spoken in Australia?", ("English",)),
)


def general_knowledge_questions() -> list[KnowledgeQuestion]:
    """Every bundled question, in a fixed order with stable ids."""
    out: list[KnowledgeQuestion] = []
    for i, (country, capital) in enumerate(CAPITALS):
        out.append(KnowledgeQuestion(f"gk-capital-{i}", f"What is the capital of {country}?",
                                     (capital,), "capital"))
    for i, (element, symbol) in enumerate(ELEMENTS):
        out.append(KnowledgeQuestion(f"gk-element-{i}",
                                     f"What is the chemical symbol of {element}?", (symbol,),
                                     "element"))
    for i, (work, author) in enumerate(WORKS):
        out.append(KnowledgeQuestion(f"gk-author-{i}", f"Who wrote {work}?", (author,),
                                     "author"))
    for i, (painting, painter) in enumerate(PAINTINGS):
        out.append(KnowledgeQuestion(f"gk-painter-{i}", f"Who painted {painting}?", (painter,),
                                     "painter"))
    for i, (country, answers) in enumerate(CONTINENTS):
        out.append(KnowledgeQuestion(f"gk-continent-{i}", f"On which continent is {country}?",
                                     answers, "continent"))
    for i, (country, answers) in enumerate(LANGUAGES):
        out.append(KnowledgeQuestion(f"gk-language-{i}",
                                     f"What language is mainly spoken in {country}?", answers,
                                     "language"))
    for i, (question, answers) in enumerate(FACTS):
        out.append(KnowledgeQuestion(f"gk-fact-{i}", question, answers, "fact"))
    return out
