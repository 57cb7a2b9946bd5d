"""Training, evaluation and plots (``flashcart-train``, ``flashcart-test``, ``flashcart-plot``)."""
