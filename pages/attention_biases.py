from pages._shared import page_header

page_header("attention_biases", "Coming soon.")
