"""flotilla.resources"""
