"""The prompts both sides of the PPO benches use (ours in bench/ppo_step.py, TRL's in bench/trl_side.py)."""

PROMPTS = [
    "Explain why the sky is blue in two sentences.",
    "Write a short poem about a cat who loves rain.",
    "What are three tips for learning a new language?",
    "Summarise the plot of Romeo and Juliet.",
    "How do I make a cup of green tea?",
    "Give me a name for a friendly robot and say why.",
    "What is the difference between weather and climate?",
    "Suggest a healthy breakfast for a busy morning.",
    "Why do leaves change colour in autumn?",
    "Describe the smell of fresh bread.",
    "How can I stay focused while studying?",
    "Tell me a fun fact about octopuses.",
    "What should I pack for a weekend hike?",
    "Explain what a prime number is to a child.",
    "Write a polite message declining an invitation.",
    "What makes a good cup of coffee?",
]
