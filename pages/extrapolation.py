from pages._shared import page_header

page_header("extrapolation", "Coming soon.")
