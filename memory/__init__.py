"""Vector memory (chromadb) of episodes, skills and reports; arrives with the memory issue."""
