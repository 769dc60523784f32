from pages._shared import page_header

page_header("home", "Coming soon.")
