from pages._shared import page_header

page_header("compare", "Coming soon.")
