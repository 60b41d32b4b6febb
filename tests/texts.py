"""Sentences used by the tests and benchmarks: varied lengths, no digits (see issue 4)."""

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
