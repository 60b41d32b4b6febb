"""Texts shared by the tests and the benchmarks: varied sentences (no digits) and a paragraph."""

SENTENCES = (
    "Hello world.",
    "Wait for me!",
    "Can you hear me clearly?",
    "The quick brown fox jumps over the lazy dog.",
    "She sells sea shells by the sea shore.",
    "Our train leaves early, so please be on time.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "Scientists discovered a new species of frog in the rainforest last year.",
    "The museum opens at noon and closes late in the evening.",
    "Batching many requests together keeps the processor busy.",
    "A gentle breeze moved through the tall grass near the old farmhouse.",
    "Would you like a cup of tea or a glass of cold water?",
    "The library will be closed for repairs until the end of the month.",
    "Every morning the baker wakes up before sunrise to prepare fresh bread for the village.",
    "Turn left at the second traffic light and the hotel will be on your right.",
    "Good night.",
)

PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff for more than a century. Every night its "
    "beam swept across the dark water, warning ships away from the rocks below. The keeper, a "
    "quiet man named Thomas, climbed the narrow stairs each evening at 6:30 pm to light the lamp. "
    "He kept a careful log of the weather, the passing ships, and the birds that rested on the "
    "railing. In 1987, a terrible storm struck the coast. Waves crashed over the walls, and the "
    "wind howled through the cracks in the windows. Thomas stayed at his post through the night, "
    "keeping the light burning while the sea raged around him. At dawn, a fishing boat limped "
    "into the harbor with its crew of 5 safe and sound. The captain later said that the light had "
    "guided them home when every other hope was lost. Years passed, and modern technology made "
    "the keeper's job unnecessary. An automatic lamp replaced the old one, and Thomas retired to "
    "a small cottage in the village. He spent his days reading, gardening, and telling stories to "
    "the children who visited. They loved to hear about the storms, the shipwrecks, and the "
    "strange lights he had seen far out at sea. When he turned 90, the village held a celebration "
    "in his honor. People came from miles around to thank him for his years of service. The "
    "mayor gave a speech, and the children sang a song they had written about the lighthouse. "
    "Thomas smiled and said that he had only done his job, but everyone knew that he had done "
    "much more than that. Today the lighthouse is a museum, and visitors can climb the same "
    "stairs that Thomas climbed so many times. At the top, they can look out over the water and "
    "imagine the long nights he spent watching the waves. A small plaque near the door tells his "
    "story, and it ends with a simple line: he kept the light. The museum is open daily from 9 "
    "am to 5 pm, and tickets cost $7.50 for adults."
)


def hostile_texts(n: int = 100_000) -> dict[str, str]:
    """Adversarial shapes of ``n`` characters for the text pipeline's cost (tests, benchmark):
    each once made a regular expression backtrack (quadratic) or a number conversion raise."""
    units = {
        "a.a.a.": "a.",
        "a-a-a-": "a-",
        "www.www.": "www.",
        "1.2.1.2.": "1.2.",
        "one digit run": "9",
        "1,1,1,": "1,",
        "dots": ".",
        "spaces then a": " ",
        "a@a@": "a@",
        "https://https://": "https://",
        "x.com/x.com/": "x.com/",
        "1/1/": "1/",
        "10:10:": "10:",
        "-1 -1 ": "-1 ",
        "one letter": "a",
        "dollar signs": "$",
    }
    texts = {name: (unit * (n // len(unit) + 1))[:n] for name, unit in units.items()}
    texts["spaces then a"] = " " * (n - 1) + "a"
    texts["a.a.a.@x.com"] = ("a." * n)[: n - 6] + "@x.com"
    return texts
