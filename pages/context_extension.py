from pages._shared import page_header

page_header("context_extension", "Coming soon.")
