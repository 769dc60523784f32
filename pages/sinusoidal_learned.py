from pages._shared import page_header

page_header("sinusoidal_learned", "Coming soon.")
