"""The workshop (issue #47): position methods a visitor writes as a formula. No Streamlit here."""
