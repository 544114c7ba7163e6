"""Capacity: instance catalog and prices, priority-list placement with fallback, providers, consolidation, cost."""
