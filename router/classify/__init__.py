"""router/classify/: the task classifier: its features and encoder, training data, cross-validation, the offline
teacher and its suggestions."""
