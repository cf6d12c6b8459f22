-- One row per user with a latest location: where they are now, how many check-ins they made,
-- in how many distinct places, and where they started. A table (Delta), rebuilt by each build.
select
    latest.username,
    latest.location as current_location,
    counts.`count` as checkins,
    places.places as distinct_places,
    places.first_place,
    case when places.places > 1 then 'traveller' else 'resident' end as mobility
from {{ source('gold', 'user_latest_location') }} as latest
left join {{ source('gold', 'user_location_counts') }} as counts
    on counts.username = latest.username
left join {{ source('gold', 'user_places') }} as places
    on places.username = latest.username
